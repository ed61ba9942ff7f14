"""The fake Hygon DMI: `fake_dmi.c` built against `dmi_subset.h`, and a DCU node to run it on.

The facts (docs/drivers.md cites each), from a C-3000 "BW" card (4 GPU slices, 65520 MiB):
profiles are queried by slice count minus one, 0 -> id 3 (`2g.15gb`, placements 0..3), 1 -> id 1
(`4g.31gb`, at 0 and 2), 2 -> INVALID_ARGUMENT (no three-slice profile), 3 -> id 0 (`8g.63gb`, at
0). The registry `/etc/dmi_mig_config/dev<N>` holds each card's PCI bus id; the card's unique id
(what ROCm SMI reports) is in sysfs beside its DRM nodes.
"""

from __future__ import annotations

from pathlib import Path

from fakes.hostfs import char_device
from fakes.parts import FakeParts, ProfileFact, build_vendor

SOURCE = Path(__file__).with_name("fake_dmi.c")
SONAME = "libhydmi_mig.so.1"
DCU_MEMORY_MIB = 65520

PROFILES: list[ProfileFact] = [
    (0, 3, 1, 1, 4, 16380, 0, "2g.15gb"),
    (1, 1, 2, 2, 2, 32760, 0, "4g.31gb"),
    (3, 0, 4, 4, 1, 65520, 0, "8g.63gb"),
]
PLACEMENTS = {3: [(0, 1), (1, 1), (2, 1), (3, 1)], 1: [(0, 2), (2, 2)], 0: [(0, 4)]}
COMPUTE = [(0, 2, 1), (1, 1, 2), (3, 0, 4)]  # (slices - 1, id, slices)


def build(out_dir: Path) -> Path:
    return build_vendor(SOURCE, SONAME, out_dir)


def pci(index: int) -> str:
    return f"0000:{0x09 + index * 0x10:02x}:00.0"


class FakeDmi(FakeParts):
    state_env = "FAKE_DMI_STATE"

    def add_dcu(self, root: Path) -> int:
        """A DCU with the measured profiles, its registry line, sysfs entries and nodes."""
        index = self.cards
        address = pci(index)
        self.add_card(1, 0, DCU_MEMORY_MIB, address, "", "Hygon DCU")
        self.add_profiles(index, PROFILES, PLACEMENTS, COMPUTE)
        registry = root / "etc/dmi_mig_config"
        (registry / "ci").mkdir(parents=True, exist_ok=True)
        (registry / f"dev{index}").write_text(address + "\n")
        sysfs = root / "sys/bus/pci/devices" / address
        (sysfs / "drm" / f"card{index + 1}").mkdir(parents=True)
        (sysfs / "drm" / f"renderD{128 + index}").mkdir()
        (sysfs / "unique_id").write_text(f"{0x5A3C11D0 + index:016x}\n")
        return index


def host_nodes(root: Path, cards: int) -> bool:
    """/dev/kfd, /dev/mkfd, each card's /dev/dri nodes and /opt/hyhal; False without CAP_MKNOD."""
    (root / "opt/hyhal/lib").mkdir(parents=True, exist_ok=True)
    made = char_device(root / "dev/kfd", 235, 0) and char_device(root / "dev/mkfd", 236, 0)
    for i in range(cards):
        made = made and char_device(root / f"dev/dri/card{i + 1}", 226, i + 1)
        made = made and char_device(root / f"dev/dri/renderD{128 + i}", 226, 128 + i)
    return made
