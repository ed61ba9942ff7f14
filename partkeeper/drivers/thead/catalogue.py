"""A PPU's GPU-instance profiles as HGML reports them: probed by index, read as v2 (v3 only for
its capability bits, where both reads agree), with their legal placements; and the compute profile
spanning a GPU instance.

The probe asks by index (0..84) and every later call takes the id the answer carries: on a PPU the
two differ (`MIG 4g48gb` is id 5), and several indices may answer with one profile.
"""

from __future__ import annotations

import ctypes

from partkeeper.drivers import profiles, vendor
from partkeeper.drivers.base import ReadError, UnknownError
from partkeeper.drivers.clib import ABSENT, Api, CallFailed, call, text
from partkeeper.drivers.mig import GiProfile
from partkeeper.drivers.thead import api


def probe(
    a: Api, op: str, card: int, dev: api.Handle, model: str | None
) -> tuple[GiProfile, ...]:
    """Every GI profile the card answers for (absent indices skipped, aliases collapsed by id).
    A plain one (no `+` variant, no GFX bit) of `model`'s table is offered. Any other failure is
    a ReadError: a probe that cannot be proven complete fails."""
    table = profiles.MODELS[model].profiles if model else {}
    seen: dict[int, GiProfile] = {}
    for index in range(api.PROFILE_PROBES):
        read = _profile_info(a, op, card, dev, index)
        if read is None or read[0].id in seen:
            continue
        v2, caps = read
        raw = text(v2.name)
        plain = bool(raw) and "+" not in raw and not caps & api.CAPS_GFX
        name = vendor.normalise_profile(raw) or f"hgml-profile-{v2.id}"
        ours = table.get(name) if plain else None
        seen[v2.id] = GiProfile(name, v2.id, v2.sliceCount, v2.instanceCount,
                                _placements(a, op, card, dev, v2.id), ours)
    return tuple(sorted(seen.values(), key=lambda p: p.id))


def _profile_info(
    a: Api, op: str, card: int, dev: api.Handle, index: int
) -> tuple[api.ProfileInfoV2, int] | None:
    """The v2 read, with the capability bits of a v3 read only where both agree (the two structs
    have one size, and a library dispatching on size fills v3 with v2's layout)."""
    v2 = api.ProfileInfoV2(version=api.PROFILE_V2)
    fn = a.hgmlDeviceGetGpuInstanceProfileInfoV
    try:
        call(fn, dev, index, ctypes.addressof(v2))
    except CallFailed as exc:
        if exc.code in ABSENT:
            return None
        raise ReadError(op, card, None, f"reading GI profile index {index}: {exc}") from exc
    v3 = api.ProfileInfoV3(version=api.PROFILE_V3)
    try:
        call(fn, dev, index, ctypes.addressof(v3))
    except CallFailed:
        return v2, 0
    fields = ("id", "sliceCount", "instanceCount", "memorySizeMB")
    agree = [getattr(v3, f) for f in fields] == [getattr(v2, f) for f in fields]
    return v2, v3.capabilities if agree and text(v3.name) == text(v2.name) else 0


def _placements(
    a: Api, op: str, card: int, dev: api.Handle, profile_id: int
) -> tuple[tuple[int, int], ...]:
    """The library's legal placements: a count query with NULL first, then the array."""
    fn = a.hgmlDeviceGetGpuInstancePossiblePlacements_v2
    count = ctypes.c_uint(0)
    try:
        call(fn, dev, profile_id, None, ctypes.byref(count))
        array = (api.Placement * max(count.value, 1))()
        call(fn, dev, profile_id, array, ctypes.byref(count))
    except CallFailed as exc:
        cause = f"reading the placements of GI profile {profile_id}: {exc}"
        raise ReadError(op, card, None, cause) from exc
    return tuple((p.start, p.size) for p in array[: count.value])


def whole_compute_profile(a: Api, card: int, gi: api.Handle, chosen: GiProfile) -> int:
    """The CI profile whose slice count equals the GI's: probed, aliases collapsed by id; exactly
    one, or the create is refused (a guess could hand out a media or graphics variant)."""
    ids: set[int] = set()
    for index in range(api.COMPUTE_PROFILE_PROBES):
        info = api.ComputeProfileInfo()
        try:
            call(a.hgmlGpuInstanceGetComputeInstanceProfileInfo, gi, index, api.ENGINE_SHARED,
                 ctypes.byref(info))
        except CallFailed as exc:
            if exc.code in ABSENT:
                continue
            raise ReadError("create", card, None, f"reading CI profile {index}: {exc}") from exc
        if info.sliceCount == chosen.slices:
            ids.add(info.id)
    if len(ids) != 1:
        cause = (f"GI profile {chosen.name} ({chosen.slices} slices) offers {len(ids)} "
                 f"whole-instance compute profiles ({sorted(ids)}), not exactly one")
        raise UnknownError("create", card, None, cause)
    return ids.pop()
