"""A T-Head node and a Hygon node on the fake vendor libraries, with their host files.

Each rig holds the fake (its state file, controls), the host root where the driver's files and
device nodes live, and opens the real driver on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import pytest
from fakes import dmi as fake_dmi
from fakes import hgml as fake_hgml
from fakes.parts import FakeParts

from partkeeper.drivers.hygon.binding import DmiDriver
from partkeeper.drivers.thead.binding import HgmlDriver

F = TypeVar("F", bound=FakeParts)


@dataclass
class Rig(Generic[F]):
    kind: str
    fake: F  # the vendor's fake, with its own controls
    root: Path
    nodes: bool  # whether the character devices could be made (needs CAP_MKNOD)

    def require_nodes(self) -> None:
        if not self.nodes:
            pytest.skip("making character devices needs CAP_MKNOD")

    def env(self) -> dict[str, str]:
        return self.fake.env()


def thead_rig(
    library: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch, modes: list[bool]
) -> Rig[fake_hgml.FakeHgml]:
    """PPUs with MIG mode on or off per card, the state in tmp, the host under tmp/host-ppu."""
    root = tmp / "host-ppu"
    root.mkdir()
    fake = fake_hgml.FakeHgml.create(library, tmp / "hgml.state", root)
    for mig in modes:
        fake.add_ppu(mig)
    monkeypatch.setenv(fake.state_env, str(fake.state))
    return Rig("hgml", fake, root, fake_hgml.host_nodes(root, len(modes)))


def hygon_rig(
    library: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch, cards: int, mig: bool = True
) -> Rig[fake_dmi.FakeDmi]:
    """DCUs under one node-wide MIG mode, the host under tmp/host-dcu."""
    root = tmp / "host-dcu"
    root.mkdir()
    fake = fake_dmi.FakeDmi.create(library, tmp / "dmi.state", root)
    fake.set_mode(int(mig))
    for _ in range(cards):
        fake.add_dcu(root)
    monkeypatch.setenv(fake.state_env, str(fake.state))
    return Rig("dmi", fake, root, fake_dmi.host_nodes(root, cards))


def open_hgml(rig: Rig[fake_hgml.FakeHgml]) -> HgmlDriver:
    return HgmlDriver(root=rig.root, paths=[str(rig.fake.library)])


def open_dmi(rig: Rig[fake_dmi.FakeDmi]) -> DmiDriver:
    return DmiDriver(root=rig.root, paths=[str(rig.fake.library)])
