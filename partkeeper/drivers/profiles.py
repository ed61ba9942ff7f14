"""Partition profile tables: which profiles a card model offers and where they may be placed.

Pure data, shared by the drivers (to create and validate) and by placement (to decide). A card has
memory slices (eight on NVIDIA and T-Head, four on Hygon); a placement is (start, size) in those
slices, and two instances conflict when their slice ranges overlap. The NVIDIA tables follow MIG's
placements without the `+me`/`+gfx` variants; the T-Head PPU and Hygon DCU tables are the profiles
measured on one card of each (docs/drivers.md says where each number comes from).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Vendor = Literal["nvidia", "thead", "hygon"]
# Vendors whose runtime makes exactly one partition visible to a container (docs/drivers.md).
ONE_PARTITION_PER_CONTAINER: frozenset[Vendor] = frozenset({"thead", "hygon"})
# How far a card's total memory may be from its model's for the card to be that model.
CARD_MEMORY_TOLERANCE = 0.1


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    size: int  # memory slices the instance occupies
    starts: tuple[int, ...]  # legal placement starts
    compute_slices: int
    memory_mib: int

    def placements(self) -> tuple[tuple[int, int], ...]:
        return tuple((start, self.size) for start in self.starts)


@dataclass(frozen=True, slots=True)
class CardModel:
    name: str
    memory_mib: int
    profiles: dict[str, Profile]
    vendor: Vendor = "nvidia"
    slices: int = 8  # memory slices of the card (eight on NVIDIA and T-Head, four on Hygon)


def _profile(name: str, size: int, starts: tuple[int, ...]) -> Profile:
    compute = int(name.split("g.", 1)[0])
    memory_gb = int(name.split(".", 1)[1].removesuffix("gb"))
    return Profile(name, size, starts, compute, memory_gb * 1024)


_ONE = (0, 1, 2, 3, 4, 5, 6)
_EVEN4 = (0, 2, 4, 6)
_EVEN3 = (0, 2, 4)


def _model(
    name: str, memory_gb: int, p1: str, p1x2: str, p2: str, p3: str, p4: str, p7: str
) -> CardModel:
    profiles = (
        _profile(p1, 1, _ONE),
        _profile(p1x2, 2, _EVEN4),
        _profile(p2, 2, _EVEN3),
        _profile(p3, 4, (0, 4)),
        _profile(p4, 4, (0,)),
        _profile(p7, 8, (0,)),
    )
    return CardModel(name, memory_gb * 1024, {p.name: p for p in profiles})


def _measured(
    name: str, vendor: Vendor, memory_mib: int, slices: int, shapes: tuple[Profile, ...]
) -> CardModel:
    return CardModel(name, memory_mib, {p.name: p for p in shapes}, vendor, slices)


# T-Head PPU: the two GPU-instance profiles observed on one PPU (8 memory slices, 96 GB).
PPU_96GB = _measured("PPU-96GB", "thead", 96 * 1024, 8, (
    Profile("4g.48gb", 4, (0, 4), 4, 48 * 1024),
    Profile("8g.96gb", 8, (0,), 8, 96 * 1024),
))
# Hygon DCU: a C-3000 "BW" card (4 GPU slices, 80 compute units, 65520 MiB); a profile's compute
# slices are its GPU slices (the library's slice count), memory as the library reports it.
DCU_64GB = _measured("DCU-64GB", "hygon", 65520, 4, (
    Profile("2g.15gb", 1, (0, 1, 2, 3), 1, 16380),
    Profile("4g.31gb", 2, (0, 2), 2, 32760),
    Profile("8g.63gb", 4, (0,), 4, 65520),
))

MODELS: dict[str, CardModel] = {
    m.name: m
    for m in (
        _model("A100-40GB", 40, "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        _model("H100-80GB", 80, "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        _model(
            "H200-141GB", 141, "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"
        ),
        PPU_96GB,
        DCU_64GB,
    )
}


class UnknownModelError(ValueError):
    pass


def model(name: str) -> CardModel:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise UnknownModelError(f"unknown card model {name!r}; known models: {known}") from None


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two (start, size) slice ranges overlap."""
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def max_instances(profile: Profile) -> int:
    """How many instances of `profile` an empty card holds (greedy over starts is exact here)."""
    taken: list[tuple[int, int]] = []
    for p in profile.placements():
        if not any(overlaps(p, t) for t in taken):
            taken.append(p)
    return len(taken)


def nearest_model(family: Iterable[CardModel], memory_mib: int) -> str | None:
    """The model of `family` whose memory is nearest `memory_mib`, if within 10 % of it, or None:
    a library reports a card's total memory, which is how one family's sizes are told apart."""
    best = min(family, key=lambda m: abs(m.memory_mib - memory_mib), default=None)
    if best is None or abs(best.memory_mib - memory_mib) > CARD_MEMORY_TOLERANCE * best.memory_mib:
        return None
    return best.name
