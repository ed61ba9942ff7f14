"""What the T-Head and Hygon drivers share: profile names, models and placement checks.

Pure functions over what a vendor library reported; the drivers keep the library calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

from partkeeper.drivers import profiles
from partkeeper.drivers.base import (
    Instance,
    InstanceSpec,
    PlacementError,
    UnknownError,
)
from partkeeper.drivers.clib import CallFailed

_CARD_MEMORY_TOLERANCE = 0.1
_GEOMETRY = re.compile(r"^(\d+)g\.?(\d+)gb$")


def normalise_profile(raw: str) -> str:
    """A vendor's profile name as a resource-name segment: "MIG 4g48gb" -> "4g.48gb".

    The `MIG ` prefix and whitespace go; the two-number geometry gets NVIDIA's dot. Any other
    shape (a `+` variant, say) is returned as the library spells it, without spaces."""
    name = "".join(raw.removeprefix("MIG ").split()).lower()
    match = _GEOMETRY.match(name)
    return f"{match[1]}g.{match[2]}gb" if match else name


def model_for(vendor: profiles.Vendor, memory_mib: int) -> str | None:
    """The profiles.py model of `vendor` nearest `memory_mib` (within 10 %), or None."""
    family = [m for m in profiles.MODELS.values() if m.vendor == vendor]
    best = min(family, key=lambda m: abs(m.memory_mib - memory_mib), default=None)
    if best is None or abs(best.memory_mib - memory_mib) > _CARD_MEMORY_TOLERANCE * best.memory_mib:
        return None
    return best.name


def legal_shape(
    spec: InstanceSpec,
    model: str | None,
    offered: Iterable[str],
    placements: Sequence[tuple[int, int]],
) -> profiles.Profile:
    """Our profile for `spec`, refusing what our table or the library does not allow.

    `offered` are the profile names the library reported; `placements` the library's legal
    (start, size) for this profile. Both must agree with profiles.py before anything is created."""
    if model is None:
        raise PlacementError(
            "create", spec.card, None, "the card's model is not in partkeeper's profile tables"
        )
    table = profiles.model(model).profiles
    ours = table.get(spec.profile)
    if ours is None or spec.profile not in set(offered):
        names = ", ".join(sorted(set(table) & set(offered))) or "none"
        cause = f"{model} offers no profile {spec.profile!r} through its library (offers {names})"
        raise PlacementError("create", spec.card, None, cause)
    if spec.start not in ours.starts or (spec.start, ours.size) not in placements:
        legal = ", ".join(str(s) for s in ours.starts if (s, ours.size) in placements)
        cause = f"start {spec.start} is not a legal placement of {spec.profile} ({legal})"
        raise PlacementError("create", spec.card, None, cause)
    return ours


def leftover_at(spec: InstanceSpec, existing: Iterable[Instance]) -> Instance | None:
    """A GPU instance exactly at `spec` left without its compute instance (a create interrupted
    between its two steps): the retried create completes it rather than refusing the slot."""
    return next(
        (
            i
            for i in existing
            if (i.profile, i.start) == (spec.profile, spec.start) and i.ci_id < 0 and not i.uuid
        ),
        None,
    )


def refuse_overlap(spec: InstanceSpec, size: int, existing: Iterable[Instance]) -> None:
    for other in existing:
        if profiles.overlaps((spec.start, size), other.placement):
            cause = f"slices {spec.start}-{spec.start + size - 1} overlap this {other.profile}"
            raise PlacementError("create", spec.card, other.uuid or f"GI {other.gi_id}", cause)


def one_partition(instances: Sequence[Instance], vendor: str) -> Instance:
    """The one partition a container of this vendor can use; more is refused with a sentence."""
    if len(instances) != 1:
        raise PlacementError(
            "allocate",
            instances[0].card if instances else None,
            None,
            f"a {vendor} container can use exactly one partition, and this one was given "
            f"{len(instances)}; request one partition per container",
        )
    return instances[0]


def profile_view(
    name: str, library_id: int, probe: int | None, instances: int,
    placements: Sequence[tuple[int, int]], model: str | None, offered: bool,
) -> dict[str, object]:
    """One profile as `partkeeper probe` shows it (the nvml driver's keys: `nvml_id` is the
    library's profile id, `nvml_profile` the index or slice query it answered), beside the table."""
    ours = profiles.MODELS[model].profiles.get(name) if model in profiles.MODELS else None
    table = [list(p) for p in ours.placements()] if ours and offered else None
    spots = [list(p) for p in placements]
    return {
        "name": name, "nvml_id": library_id, "nvml_profile": probe, "offered": offered,
        "instances": instances, "placements": spots, "table_placements": table,
        "matches": None if table is None else spots == table,
    }


def undo_create(
    spec: InstanceSpec, cause: str, destroy_ci: Callable[[], object] | None,
    destroy_gi: Callable[[], object],
) -> UnknownError:
    """Undo a create that failed after its GPU instance existed (the allocator's own undo,
    invariant 2): destroy the compute instance, if one was made, then the GPU instance. The error
    returned says whether the undo left anything behind for the reclaimer to find."""
    what = f"the {spec.profile} GPU instance at start {spec.start} was created but {cause}"
    try:
        if destroy_ci is not None:
            destroy_ci()
        destroy_gi()
    except CallFailed as exc:
        return UnknownError("create", spec.card, None, f"{what}; undoing it failed too ({exc})")
    return UnknownError("create", spec.card, None, f"{what}; it was destroyed again")
