"""What both modes of the allocator share: the state they read and the claims they write.

    context.py     what the parts share, built once (`build.py`), started in order (`startup.py`)
    snapshot.py    one read of claims, instances and Pod states; views.py: what may be reused
    podview.py     the watcher's Pods, mirrored; podresources.py: kubelet's pod-resources view
    catalog.py     what the node offers (pure); placement.py: where a partition goes (pure)
    capacity.py, tokens.py, advertise.py, recompute.py   what is free, computed and published
    writes.py      the claims writer: every claim transition the allocator makes
    partitions.py  realising a partition claim: create (or adopt) -> activate, undo on failure
    sliced.py      realising logical slices of sliced cards: the limiter files -> activate
    handoff.py     what a container needs for its active claims: edits and CDI specs
    reclaimer.py   asking the reclaimer to make room now
    patience.py    the bounded wait for a claims store that does not answer
    refusal.py     the domain errors: why nothing was handed over, without a transport's codes

Neither mode is imported here: device-plugin mode (`deviceplugin/`) and DRA mode (`dra/`) each
turn a `Refusal` into their protocol's answer (pyproject.toml, the import contracts).
"""
