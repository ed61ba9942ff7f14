"""What NVML says a card offers, read once per card, and whether it agrees with profiles.py.

The driver reads every GPU-instance profile NVML reports (its id, slice count, instance count,
memory) and, for the base profiles partkeeper creates, the legal placements
(`nvmlDeviceGetGpuInstancePossiblePlacements`, count query then array; compared as a set). A
profile NVML lists but answers NOT_SUPPORTED or INVALID_ARGUMENT for when asked its placements has
none (NVIDIA's DRA driver skips it the same way, cmd/gpu-kubelet-plugin/nvlib.go); the answer is
kept for `partkeeper probe`, and the other profiles and cards are read as usual. A card whose NVML
view of a base profile disagrees with the built-in tables (other placements or none, another size
or instance count) is refused: it is listed under NVML's own name and offered no profile, so
capacity never advertises a slot the planner's tables and the hardware see differently. Its
instances are still listed and counted occupied. docs/drivers.md (NVIDIA) records this decision.
"""

from __future__ import annotations

import ctypes
import re
from types import ModuleType
from typing import Any

from partkeeper.drivers import profiles
from partkeeper.drivers.mig import GiProfile, same_placements

# The GI profiles partkeeper creates. The +me/+gfx/-me variants share slice count and memory with
# these, so matching a profile name is restricted to this set; enumeration covers every profile.
BASE_GI_PROFILES = ("1_SLICE", "1_SLICE_REV2", "2_SLICE", "3_SLICE", "4_SLICE", "7_SLICE")
# NVML reports the usable memory of a profile, somewhat under its nominal size.
_PROFILE_MEMORY_TOLERANCE = 0.25


def model_for(name: str, memory_mib: int) -> str | None:
    """The profiles.py model of a card NVML calls `name` with `memory_mib` in total, or None.

    The family comes from the name as a whole word (so "GH200" is no "H200"), the size from the
    memory, because one family ships in several sizes (A100 40GB and 80GB).
    """
    family = [
        m
        for m in profiles.MODELS.values()
        if m.vendor == "nvidia" and re.search(rf"\b{m.name.split('-')[0]}\b", name)
    ]
    return profiles.nearest_model(family, memory_mib)


def nvml_name(info: Any) -> str:
    raw = getattr(info, "name", b"")
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return text.removeprefix("MIG ").strip()


def match(table: dict[str, profiles.Profile], info: Any) -> profiles.Profile | None:
    """Our profile for an NVML GI profile: by name when NVML gives one, else slices and memory."""
    named = table.get(nvml_name(info))
    if named is not None:
        return named
    same = [p for p in table.values() if p.compute_slices == info.sliceCount]
    best = min(same, key=lambda p: abs(p.memory_mib - info.memorySizeMB), default=None)
    if best is None or abs(best.memory_mib - info.memorySizeMB) > (
        _PROFILE_MEMORY_TOLERANCE * best.memory_mib
    ):
        return None
    return best


def placements(nv: ModuleType, dev: Any, nvml_id: int) -> tuple[tuple[int, int], ...]:
    """The legal placements of a GI profile: NVML's count query (NULL buffer), then the array."""
    count = ctypes.c_uint(0)
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(dev, nvml_id, None, ctypes.byref(count))
    array = (nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(dev, nvml_id, array, ctypes.byref(count))
    return tuple((p.start, p.size) for p in array[: count.value])


def disagreement(found: list[GiProfile], model: str) -> str:
    """How NVML's view of the base profiles differs from profiles.py for `model` ("" if not)."""
    table = profiles.MODELS[model].profiles
    seen = {p.ours.name: p for p in found if p.ours is not None}
    problems = [f"NVML offers no {name}" for name in table if name not in seen]
    for name, nv in seen.items():
        ours = table[name]
        most = profiles.max_instances(ours)
        if nv.unplaceable:
            problems.append(f"NVML gives no placements for {name} ({nv.unplaceable})")
        elif not same_placements(nv.placements, ours.placements()):
            problems.append(f"{name} placements {sorted(nv.placements)}, the tables "
                            f"{list(ours.placements())}")
        elif nv.max_count != most:
            problems.append(f"{name} holds {nv.max_count} instances, the tables {most}")
    return "; ".join(problems)
