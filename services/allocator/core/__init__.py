"""What both modes of the allocator share: the state they read and the claims they write.

    state.py       what the parts share (`Context`, built once by `build.py`, started in order
                   by `startup.py`), the views a plan may reuse, the reads of claims, instances
                   and Pod states, and the bounded wait for a store that does not answer
    podview.py     the watcher's Pods, mirrored
    catalog.py     what the node offers (pure); placement.py: where a partition goes, for whom,
                   on which snapshot (pure)
    capacity.py, tokens.py, advertise.py, recompute.py   what is free, computed and published
    writes.py      the claims writer, every claim transition the allocator makes, and realising
                   a partition through them: claim -> create (or adopt) -> activate, undo
    sliced.py      realising logical slices of sliced cards: the limiter files -> activate
    handoff.py     what a container needs for its active claims: edits and CDI specs
    reclaimer.py   asking the reclaimer to make room now
    refusal.py     the domain errors: why nothing was handed over, without a transport's codes

Neither mode is imported here: device-plugin mode (`deviceplugin/`) and DRA mode (`dra/`) each
turn a `Refusal` into their protocol's answer (pyproject.toml, the import contracts).
"""
