"""The fake T-Head HGML: `fake_hgml.c` built against `hgml_subset.h`, and a PPU node to run it on.

The facts (docs/drivers.md cites each): profiles are found by probing indices, and the index is not
the id: `MIG 4g48gb` is id 5 (two instances of four memory slices), `MIG 8g96gb` id 3 (one spanning
all eight); here also a `+gfx` variant with the GFX capability bit, and an index aliasing a profile
already seen. A PPU's minor is its ordinal plus one (`/dev/alixpu` takes minor 0).
"""

from __future__ import annotations

from pathlib import Path

from fakes.hostfs import char_device
from fakes.parts import FakeParts, ProfileFact, build_vendor

SOURCE = Path(__file__).with_name("fake_hgml.c")
SONAME = "libhgml.so"
PPU_MEMORY_MIB = 96 * 1024
CAPS_GFX = 0x2

PROFILES: list[ProfileFact] = [
    (1, 5, 4, 4, 2, 49152, 0, "MIG 4g48gb"),
    (2, 7, 4, 4, 2, 49152, CAPS_GFX, "MIG 4g48gb+gfx"),
    (4, 3, 8, 8, 1, 98304, 0, "MIG 8g96gb"),
    (6, 5, 4, 4, 2, 49152, 0, "MIG 4g48gb"),  # an alias of index 1
]
PLACEMENTS = {5: [(0, 4), (4, 4)], 7: [(0, 4), (4, 4)], 3: [(0, 8)]}
COMPUTE = [(0, 0, 1), (3, 3, 4), (5, 5, 8), (9, 5, 8)]  # (probe, id, slices); 9 aliases 5


def build(out_dir: Path, *, old_init: bool = False) -> Path:
    """The fake; `old_init` builds an older library exporting `hgmlInit` but no `hgmlInit_v2`."""
    return build_vendor(SOURCE, SONAME, out_dir, ("FAKE_HGML_OLD_INIT",) if old_init else ())


class FakeHgml(FakeParts):
    state_env = "FAKE_HGML_STATE"

    def add_ppu(self, mig: bool = True, profiles: list[ProfileFact] | None = None) -> int:
        """A PPU with the measured profiles (or `profiles`), and its device nodes on the host."""
        index = self.cards
        uuid = f"GPU-5e2d1c00-0000-4000-8000-{index:012x}"
        self.add_card(
            int(mig), index + 1, PPU_MEMORY_MIB, f"0000:{0x10 + index:02x}:00.0", uuid, "T-Head PPU"
        )
        if mig:
            self.add_profiles(index, profiles or PROFILES, PLACEMENTS, COMPUTE)
        return index


def host_nodes(root: Path, cards: int) -> bool:
    """/dev/alixpu, /dev/alixpu_ctl and /dev/alixpu_ppu<N> (minor N+1); False without CAP_MKNOD."""
    made = char_device(root / "dev/alixpu", 510, 0)
    made = made and char_device(root / "dev/alixpu_ctl", 510, 255)
    for i in range(cards):
        made = made and char_device(root / f"dev/alixpu_ppu{i}", 510, i + 1)
    return made
