"""Controls of the partitionable cards the T-Head and Hygon fakes share (common/fakeparts.c).

Everything here is what no vendor call does: describing the hardware (cards and the profiles their
library reports), a process holding a partition, a lag on an entry point, a vendor quirk. Failure
injection, call counts and complaints come from FakeLibrary (common/fakestate.c).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from tests_support.clib import COMMON_INCLUDE, COMMON_SOURCES, FakeLibrary, build_shared_library

PARTS_SOURCE = COMMON_INCLUDE / "fakeparts.c"

# (probe index, id, compute slices, memory slices, instances, memory MB, capability bits, name)
ProfileFact = tuple[int, int, int, int, int, int, int, str]


def build_vendor(source: Path, soname: str, out_dir: Path, defines: tuple[str, ...] = ()) -> Path:
    return build_shared_library(
        soname,
        [source, *COMMON_SOURCES, PARTS_SOURCE],
        out_dir,
        include_dirs=[COMMON_INCLUDE, source.parent],
        defines=defines,
    )


class FakeParts(FakeLibrary):
    cards = 0  # cards added through this handle (the fake numbers them from 0)

    @classmethod
    def create(cls, library: Path, state: Path, root: Path | None = None):
        """A new state with no cards; the fake keeps the driver's files under `root`."""
        fake = cls(library, state)
        fake.check(
            fake.lib.fake_parts_new(bytes(state), bytes(root) if root else None),
            "creating the state",
        )
        return fake

    def set_mode(self, current: int, pending: int | None = None) -> None:
        pending = current if pending is None else pending
        self.check(self.lib.fake_parts_set_mode(bytes(self.state), current, pending), "mode")

    def add_card(
        self, mig: int, minor: int, memory_mib: int, pci: str, uuid: str, name: str
    ) -> int:
        rc = self.lib.fake_parts_add_card(
            bytes(self.state),
            mig,
            mig,
            minor,
            ctypes.c_ulonglong(memory_mib),
            pci.encode(),
            uuid.encode(),
            name.encode(),
        )
        self.cards += 1
        return self.check(rc, f"adding card {pci}")

    def add_profiles(
        self,
        card: int,
        facts: list[ProfileFact],
        placements: dict[int, list[tuple[int, int]]],
        compute: list[tuple[int, int, int]],
    ) -> None:
        s = bytes(self.state)
        for probe, pid, slices, mem, count, mb, caps, name in facts:
            rc = self.lib.fake_parts_add_profile(
                s, card, probe, pid, slices, mem, count, ctypes.c_ulonglong(mb), caps, name.encode()
            )
            self.check(rc, f"adding profile {name}")
        for pid, spots in placements.items():
            for start, size in spots:
                self.check(self.lib.fake_parts_add_placement(s, card, pid, start, size), "place")
        for probe, cid, slices in compute:
            self.check(self.lib.fake_parts_add_ci_profile(s, card, probe, cid, slices), "ci")

    def set_busy(self, uuid: str, on: bool) -> None:
        """A process starts or stops holding the compute instance with this identity (as the
        fake records it: the MIG device UUID for HGML, the bare `mig_uuid` for DMI)."""
        rc = self.lib.fake_parts_set_busy(bytes(self.state), uuid.encode(), int(on))
        self.check(rc, f"marking {uuid} busy={on}")

    def lag(self, fn: str, ms: int) -> None:
        self.check(self.lib.fake_parts_lag(bytes(self.state), fn.encode(), ms), f"lag on {fn}")

    def quirk(self, name: str, value: int = 1) -> None:
        rc = self.lib.fake_parts_quirk(bytes(self.state), name.encode(), ctypes.c_long(value))
        self.check(rc, f"quirk {name}")

    def count(self, card: int, what: str) -> int:
        """How many GPU instances ("gi") or compute instances ("ci") exist on `card`."""
        rc = self.lib.fake_parts_count(bytes(self.state), card, 0 if what == "gi" else 1)
        return self.check(rc, "counting instances")
