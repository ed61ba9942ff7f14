"""A DCU's GPU-instance profiles as DMI reports them, and the compute profile spanning a GPU
instance: both queried by slice count minus one, not by id (measured on a C-3000: 0 -> id 3,
1 -> id 1, 2 -> INVALID_ARGUMENT, 3 -> id 0). A width the card does not offer answers with an
absent code and is skipped; any other failure is a ReadError.
"""

from __future__ import annotations

import ctypes

from partkeeper.drivers import profiles, vendor
from partkeeper.drivers.base import ReadError
from partkeeper.drivers.clib import ABSENT, Api, CallFailed, call, text
from partkeeper.drivers.hygon import api
from partkeeper.drivers.mig import GiProfile


def probe(a: Api, op: str, card: int, dev: int, model: str | None) -> tuple[GiProfile, ...]:
    """Every profile the card answers for; those of `model`'s table are offered."""
    table = profiles.MODELS[model].profiles if model else {}
    found: list[GiProfile] = []
    for width in api.SLICE_WIDTHS:
        info = api.GpuInstanceProfileInfo()
        try:
            call(a.nvmlDeviceGetGpuInstanceProfileInfo, dev, width - 1, ctypes.byref(info))
        except CallFailed as exc:
            if exc.code in ABSENT:
                continue  # no profile this wide (every card measured lacks three slices)
            raise ReadError(op, card, None, f"reading the {width}-slice profile: {exc}") from exc
        name = vendor.normalise_profile(text(info.name)) or f"dmi-profile-{info.id}"
        places = _placements(a, op, card, dev, info.id)
        found.append(GiProfile(name, info.id, info.gpu_slice_count, len(places), places,
                               table.get(name), width - 1))
    return tuple(found)


def _placements(
    a: Api, op: str, card: int, dev: int, profile_id: int
) -> tuple[tuple[int, int], ...]:
    array = (api.Placement * api.MAX_INSTANCES)()
    count = ctypes.c_uint(api.MAX_INSTANCES)
    try:
        call(a.nvmlDeviceGetGpuInstancePossiblePlacements, dev, profile_id, array,
             ctypes.byref(count))
    except CallFailed as exc:
        cause = f"reading the placements of profile {profile_id}: {exc}"
        raise ReadError(op, card, None, cause) from exc
    return tuple((p.start, p.size) for p in array[: min(count.value, api.MAX_INSTANCES)])


def compute_profile(a: Api, op: str, card: int, gi: int, slices: int) -> int | None:
    """The id of the compute profile spanning a GI of `slices` slices, or None if none is."""
    info = api.ComputeInstanceProfileInfo()
    try:
        call(a.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, slices - 1, api.ENGINE_SHARED,
             ctypes.byref(info))
    except CallFailed as exc:
        if exc.code in ABSENT:
            return None
        raise ReadError(op, card, None, f"reading the whole-GI compute profile: {exc}") from exc
    return info.id
