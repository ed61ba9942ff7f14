"""What one card can offer as DRA devices: one device per (profile, legal placement).

Pure data about names and order. A device's name says where its partition goes:
`gpu-<card>-mig-<profile without the dot>-<start>`, e.g. `gpu-0-mig-1g10gb-6`; `parse` reads one
back. Order is smallest profile first (compute slices, then memory), then card, then start: the
scheduler takes the first device that fits, so small requests never take a large profile's room
while a small device is free.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from partkeeper.drivers import Card
from partkeeper.drivers.profiles import Profile, model

_NAME = re.compile(r"^gpu-(\d+)-mig-(\d+g\d+gb)-(\d+)$")


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One offerable placement: the spec of a partition that does not exist yet."""

    card: int
    model: str
    profile: Profile
    start: int

    @property
    def size(self) -> int:
        return self.profile.size

    @property
    def range(self) -> tuple[int, int]:
        return (self.start, self.profile.size)

    @property
    def name(self) -> str:
        return device_name(self.card, self.profile.name, self.start)


def device_name(card: int, profile: str, start: int) -> str:
    return f"gpu-{card}-mig-{profile.replace('.', '')}-{start}"


def parse(name: str, cards: Iterable[Card]) -> DeviceSpec | None:
    """The spec a device name stands for on these cards, or None when it names none of ours."""
    match = _NAME.match(name)
    if match is None:
        return None
    index, compact, start = int(match[1]), match[2], int(match[3])
    for card in cards:
        if card.index != index or card.mode != "partition":
            continue
        for spec in card_devices(card):
            if spec.profile.name.replace(".", "") == compact and spec.start == start:
                return spec
    return None


def _order(profile: Profile) -> tuple[int, int, str]:
    return (profile.compute_slices, profile.memory_mib, profile.name)


def card_devices(card: Card) -> list[DeviceSpec]:
    """Every (profile, placement) of a partition-mode card, smallest profile first."""
    if card.mode != "partition":
        return []
    profiles = sorted(model(card.model).profiles.values(), key=_order)
    return [DeviceSpec(card.index, card.model, p, s) for p in profiles for s in p.starts]


def all_devices(cards: Iterable[Card]) -> list[DeviceSpec]:
    """Every device of the node in publishing order: profile size, then card, then start."""
    specs = [d for card in cards for d in card_devices(card)]
    return sorted(specs, key=lambda d: (_order(d.profile), d.card, d.start))


def memory_slices(card_model: str) -> int:
    """Memory slices of a whole card: how far its placements reach (four on a Hygon DCU, eight on
    NVIDIA and T-Head), so every slice a device can consume is a counter of its card."""
    return max(s + p.size for p in model(card_model).profiles.values() for s in p.starts)


def compute_capacity(card_model: str) -> int:
    """Compute slices of a whole card: what its largest profile uses."""
    return max(p.compute_slices for p in model(card_model).profiles.values())
