"""A T-Head node and a Hygon node on the fake libraries: hardware facts, host files, the driver.

The facts (docs/drivers.md cites each):
- T-Head PPU: profiles found by probing indices, the index not the id: `MIG 4g48gb` is id 5 (two
  instances of four memory slices), `MIG 8g96gb` id 3 (one spanning all eight); a `+gfx` variant
  with the GFX capability bit; an index aliasing a profile already seen. The PPU node's minor is its
  ordinal plus one (`/dev/alixpu` takes minor 0).
- Hygon DCU (C-3000 "BW", 4 GPU slices, 65520 MiB): profile by slice count minus one, 0 -> id 3
  (`2g.15gb`, placements 0..3), 1 -> id 1 (`4g.31gb`, at 0 and 2), 2 -> INVALID_ARGUMENT, 3 -> id 0
  (`8g.63gb`, at 0); the registry `/etc/dmi_mig_config/dev<N>` holds each card's PCI bus id.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from partkeeper.drivers.dmi import DmiDriver
from partkeeper.drivers.hgml import HgmlDriver

from .fakehw import FakeHardware, build

PPU_MEMORY_MIB = 96 * 1024
DCU_MEMORY_MIB = 65520

# (probe index, id, compute slices, memory slices, instances, memory MB, caps, name)
PPU_PROFILES = [
    (1, 5, 4, 4, 2, 49152, 0, "MIG 4g48gb"),
    (2, 7, 4, 4, 2, 49152, 0x2, "MIG 4g48gb+gfx"),
    (4, 3, 8, 8, 1, 98304, 0, "MIG 8g96gb"),
    (6, 5, 4, 4, 2, 49152, 0, "MIG 4g48gb"),  # an alias of index 1
]
PPU_PLACEMENTS = {5: [(0, 4), (4, 4)], 7: [(0, 4), (4, 4)], 3: [(0, 8)]}
PPU_CI_PROFILES = [(0, 0, 1), (3, 3, 4), (5, 5, 8), (9, 5, 8)]  # (probe, id, slices)

DCU_PROFILES = [
    (0, 3, 1, 1, 4, 16380, 0, "2g.15gb"),
    (1, 1, 2, 2, 2, 32760, 0, "4g.31gb"),
    (3, 0, 4, 4, 1, 65520, 0, "8g.63gb"),
]
DCU_PLACEMENTS = {3: [(0, 1), (1, 1), (2, 1), (3, 1)], 1: [(0, 2), (2, 2)], 0: [(0, 4)]}
DCU_CI_PROFILES = [(0, 2, 1), (1, 1, 2), (3, 0, 4)]


def _profiles(card: int, table, placements, ci_table) -> list[str]:
    lines = [f"profile {card} {p} {i} {s} {m} {n} {mb} {c} {name}"
             for p, i, s, m, n, mb, c, name in table]
    lines += [f"place {card} {pid} {start} {size}"
              for pid, spots in placements.items() for start, size in spots]
    lines += [f"ciprofile {card} {p} {i} {s}" for p, i, s in ci_table]
    return lines


def _char(path: Path, major: int, minor: int) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    except PermissionError:
        return False
    return True


@dataclass
class Rig:
    kind: str
    hw: FakeHardware
    root: Path
    library: Path
    nodes: bool  # whether character devices could be made (needs CAP_MKNOD)

    def require_nodes(self) -> None:
        if not self.nodes:
            pytest.skip("making character devices needs CAP_MKNOD")


def thead_rig(tmp: Path, monkeypatch: pytest.MonkeyPatch, modes: list[int]) -> Rig:
    """PPUs with MIG mode per card (1 on, 0 off)."""
    lib = build("hgml", "libhgml.so", tmp / "lib-hgml")
    root = tmp / "host-ppu"
    lines = ["mode 0 0", "serial 0"]
    for i, mode in enumerate(modes):
        lines.append(f"card {i} {mode} {mode} {i + 1} {PPU_MEMORY_MIB} PPU-96GB "
                     f"0000:{0x10 + i:02x}:00.0 GPU-5e2d1c00-0000-4000-8000-00000000{i:04x} "
                     "T-Head PPU")
        if mode:
            lines += _profiles(i, PPU_PROFILES, PPU_PLACEMENTS, PPU_CI_PROFILES)
    hw = FakeHardware(tmp / "hgml-state.txt")
    hw.write(lines)
    nodes = _char(root / "dev/alixpu", 510, 0) and _char(root / "dev/alixpu_ctl", 510, 255)
    for i in range(len(modes)):
        nodes = nodes and _char(root / f"dev/alixpu_ppu{i}", 510, i + 1)
    monkeypatch.setenv("PK_FAKE_HGML_STATE", str(hw.path))
    monkeypatch.setenv("PK_FAKE_HGML_ROOT", str(root))
    return Rig("hgml", hw, root, lib, nodes)


def open_hgml(rig: Rig) -> HgmlDriver:
    return HgmlDriver(root=rig.root, paths=[str(rig.library)])


def dcu_pci(index: int) -> str:
    return f"0000:{0x09 + index * 0x10:02x}:00.0"


def hygon_rig(tmp: Path, monkeypatch: pytest.MonkeyPatch, cards: int, mode: int = 1) -> Rig:
    """DCUs under one node-wide MIG mode."""
    lib = build("dmi", "libhydmi_mig.so.1", tmp / "lib-dmi")
    root = tmp / "host-dcu"
    lines = [f"mode {mode} {mode}", "serial 0"]
    nodes = _char(root / "dev/kfd", 235, 0) and _char(root / "dev/mkfd", 236, 0)
    (root / "opt/hyhal/lib").mkdir(parents=True)
    for i in range(cards):
        pci = dcu_pci(i)
        lines.append(f"card {i} {mode} {mode} 0 {DCU_MEMORY_MIB} DCU-64GB {pci} - Hygon DCU")
        lines += _profiles(i, DCU_PROFILES, DCU_PLACEMENTS, DCU_CI_PROFILES)
        registry = root / "etc/dmi_mig_config"
        registry.mkdir(parents=True, exist_ok=True)
        (registry / f"dev{i}").write_text(pci + "\n")
        sysfs = root / "sys/bus/pci/devices" / pci
        (sysfs / "drm" / f"card{i + 1}").mkdir(parents=True)
        (sysfs / "drm" / f"renderD{128 + i}").mkdir()
        (sysfs / "unique_id").write_text(f"{0x5a3c11d0 + i:016x}\n")
        nodes = nodes and _char(root / f"dev/dri/card{i + 1}", 226, i + 1)
        nodes = nodes and _char(root / f"dev/dri/renderD{128 + i}", 226, 128 + i)
    (root / "etc/dmi_mig_config/ci").mkdir(parents=True, exist_ok=True)
    hw = FakeHardware(tmp / "dmi-state.txt")
    hw.write(lines)
    monkeypatch.setenv("PK_FAKE_DMI_STATE", str(hw.path))
    monkeypatch.setenv("PK_FAKE_DMI_ROOT", str(root))
    return Rig("dmi", hw, root, lib, nodes)


def open_dmi(rig: Rig) -> DmiDriver:
    return DmiDriver(root=rig.root, paths=[str(rig.library)])
