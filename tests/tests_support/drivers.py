"""The driver harnesses: each driver on its own node, with the hands a test needs on its "hardware".

One harness per driver kind, and the contract suite (test_contract.py, test_half_done.py) runs on
every one. A harness describes its node (the partition-mode cards by profiles.py model, then the
sliced ones), what its vendor does that others do not (identity of a successor, whether busy can be
read), the nodes its host hands whole cards over with, and how its fake injects each fault (every
harness can inject all of them); a test reads those and never asks which driver it has.

A driver added later adds a node to `NODES` and a builder to `BUILDERS`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec
import pytest
from fakes.nvml import ERROR_UNKNOWN

from partkeeper.drivers import profiles
from partkeeper.drivers.base import Driver, Instance
from partkeeper_sim.driver import SimDriver, init_state
from schemas import Claim, LiveInstance
from tests_support import make_claim
from tests_support.clib import FakeLibrary
from tests_support.vendor_rigs import hygon_rig, open_dmi, open_hgml, thead_rig


@dataclass(frozen=True)
class Node:
    partition: tuple[str, ...]  # models of the partition-mode cards, numbered from 0
    sliced: tuple[str, ...] = ()  # models of the sliced cards, numbered after them

    @property
    def models(self) -> tuple[str, ...]:
        return self.partition + self.sliced


NVIDIA_NODE = Node(("H100-80GB", "A100-40GB", "H200-141GB"), ("A100-40GB",))
THEAD_NODE = Node(("PPU-96GB", "PPU-96GB"), ("PPU-96GB",))
# Hygon's MIG mode is node-wide: every card is in partition mode or every card is sliced.
HYGON_NODE = Node(("DCU-64GB", "DCU-64GB"))

NODES: dict[str, Node] = {
    "sim": NVIDIA_NODE, "nvml": NVIDIA_NODE,
    "sim-ppu": THEAD_NODE, "hgml": THEAD_NODE,
    "sim-dcu": HYGON_NODE, "dmi": HYGON_NODE,
}  # fmt: skip
KINDS = list(NODES)


@dataclass(frozen=True)
class Shape:
    """One profile on the first card of its model in a harness's node (conftest's `shape`)."""

    card: int
    model: str
    profile: profiles.Profile


def shapes(kind: str) -> list[Shape]:
    """Every profile of every model among the partition-mode cards of `kind`'s node."""
    node = NODES[kind]
    firsts = {model: node.partition.index(model) for model in dict.fromkeys(node.partition)}
    return [
        Shape(card, model, shape)
        for model, card in firsts.items()
        for shape in profiles.model(model).profiles.values()
    ]


# Vendors whose successor at the same slot gets its predecessor's UUID (name-based MIG identity);
# Hygon issues a fresh one on every create (docs/drivers.md, Identity per driver).
REPRODUCED_IDENTITY: frozenset[profiles.Vendor] = frozenset({"nvidia", "thead"})

# The env variable through which a vendor's runtime takes whole cards (their UUIDs, comma
# separated); T-Head's and Hygon's take device nodes only (docs/drivers.md, Container edits).
CARDS_ENV: dict[profiles.Vendor, str] = {"nvidia": "NVIDIA_VISIBLE_DEVICES"}


@dataclass(frozen=True)
class CardNodes:
    """The container paths whole cards are handed over with on a harness's host: the nodes every
    card shares (once per container), then each card's own by index, and the mounts (read-only).
    Empty on the sim, which has no nodes."""

    shared: tuple[str, ...] = ()
    own: Callable[[int], tuple[str, ...]] = lambda index: ()
    mounts: tuple[str, ...] = ()


# What a fake can break. `list`: the next enumeration of GPU instances; `gi_destroy`: the next
# GPU-instance destroy (a destroy stops after the CI is gone); `ci_create`: the next compute-
# instance create (a create stops after the GI exists).
Fault = Literal["list", "gi_destroy", "ci_create"]
# The entry point each fault breaks, after the library's prefix (DMI keeps NVML's names).
FAULT_CALLS: dict[Fault, str] = {
    "list": "DeviceGetGpuInstances",
    "gi_destroy": "GpuInstanceDestroy",
    "ci_create": "GpuInstanceCreateComputeInstance",
}


class Hands:
    """What a test does to the "hardware" that no driver call does."""

    def set_busy(self, instance: Instance, on: bool) -> None:
        raise NotImplementedError

    def fail(self, fault: Fault) -> None:
        raise NotImplementedError

    def complaints(self) -> tuple[int, str]:
        """Calls a real library would have rejected (none on the sim)."""
        return 0, ""


class SimHands(Hands):
    """The fakes' faults in the sim's words. The sim is driver and hardware in one, so a stopped
    compute-instance create alone is a create the driver undid (a plain failure), and with the
    GPU-instance destroy after it (the undo dying too) a create stopped halfway."""

    def __init__(self, driver: SimDriver) -> None:
        self.driver = driver
        self.armed: set[Fault] = set()

    def set_busy(self, instance: Instance, on: bool) -> None:
        self.driver.set_busy(instance.uuid, on)

    def fail(self, fault: Fault) -> None:
        if fault == "list":
            self.driver.fail("list", 1)
        elif fault == "ci_create":
            self.driver.fail("create", 1, "unknown")
        elif "ci_create" in self.armed:
            self.driver.fail("create", 1, "halfway")
        else:
            self.driver.fail("destroy", 1, "halfway")
        self.armed.add(fault)


class LibraryHands(Hands):
    """A fake C library: failures armed on its entry points, busy set through its controls."""

    def __init__(
        self, fake: FakeLibrary, prefix: str, busy: Callable[[Instance, bool], None]
    ) -> None:
        self.fake = fake
        self.prefix = prefix
        self.busy = busy

    def set_busy(self, instance: Instance, on: bool) -> None:
        self.busy(instance, on)

    def fail(self, fault: Fault) -> None:
        self.fake.fail(self.prefix + FAULT_CALLS[fault], ERROR_UNKNOWN)

    def complaints(self) -> tuple[int, str]:
        return self.fake.complaints()


@dataclass
class Harness:
    kind: str
    driver: Driver
    node: Node
    hands: Hands
    busy_unknown: str | None = None  # why is_busy cannot answer (its ReadError says so), if so
    card_nodes: CardNodes = CardNodes()
    # How the library numbers a new GPU instance at (start, size): None for the lowest free id
    # from 1 (the sim, HGML, DMI), else the slot's own id (NVML: nvml_slot_gi).
    slot_gi: Callable[[int, int], int] | None = None

    def new_gi(self, start: int, size: int, lowest: int) -> int:
        """The GI id a create at (start, size) gets, where `lowest` is the lowest free one."""
        return self.slot_gi(start, size) if self.slot_gi is not None else lowest

    @property
    def vendor(self) -> profiles.Vendor:
        return profiles.model(self.node.partition[0]).vendor

    @property
    def cards_env(self) -> str | None:
        return CARDS_ENV.get(self.vendor)

    @property
    def reproduces_identity(self) -> bool:
        return self.vendor in REPRODUCED_IDENTITY

    @property
    def tables(self) -> dict[str, profiles.Profile]:
        """The profiles of card 0, where the single-card contract runs."""
        return profiles.model(self.node.partition[0]).profiles

    @property
    def smallest(self) -> profiles.Profile:
        return min(self.tables.values(), key=lambda p: p.size)

    @property
    def largest(self) -> profiles.Profile:
        return max(self.tables.values(), key=lambda p: p.size)

    @property
    def away_from_zero(self) -> tuple[profiles.Profile, int]:
        """The largest profile with more than one placement, at its last start: a partition whose
        slot is not the card's first (H100 3g.40gb at 4, PPU 4g.48gb at 4, DCU 4g.31gb at 2)."""
        shape = max((p for p in self.tables.values() if len(p.starts) > 1), key=lambda p: p.size)
        return shape, shape.starts[-1]

    def fail(self, fault: Fault) -> None:
        """The next call of `fault`'s kind fails with an error the driver cannot classify."""
        self.hands.fail(fault)

    def set_busy(self, instance: Instance, on: bool) -> None:
        self.hands.set_busy(instance, on)


def sim_state(path: Path, node: Node) -> Path:
    init_state(path, list(node.partition), list(node.sliced))
    return path


def _sim(kind: str) -> Callable[[pytest.FixtureRequest], Harness]:
    def build(request: pytest.FixtureRequest) -> Harness:
        tmp: Path = request.getfixturevalue("tmp_path")
        driver = SimDriver(sim_state(tmp / "sim.json", NODES[kind]))
        return Harness(kind, driver, NODES[kind], SimHands(driver))

    return build


def _node_or_stand_in(path: str, mode: int, device: int) -> None:
    """The capability node, or where this process may not make nodes (no CAP_MKNOD) a plain file
    in its place: the contract checks what a container gets, not the host's nodes
    (test_handoff.py does, where nodes can be made)."""
    try:
        os.mknod(path, mode, device)
    except PermissionError:
        Path(path).touch()


def nvml_slot_gi(start: int, size: int) -> int:
    """Real NVML's GI id of the slot (start, size) of an 8-slot card: its node in the slot tree
    (full card 0, halves 1-2, quarters 3-6, eighths 7-14), as the C fake gives them."""
    return 8 // size - 1 + start // size


def _nvml(request: pytest.FixtureRequest) -> Harness:
    from partkeeper.drivers.nvidia.binding import NvmlDriver

    fake = request.getfixturevalue("fake_nvml")  # the NVIDIA node, conftest.py

    def busy(instance: Instance, on: bool) -> None:
        fake.set_processes(instance.uuid, int(on))

    # Opened on the fake's tree as open_driver opens it on PK_DRIVER_ROOT and PK_PROC_ROOT: the
    # capability files that name a partition's device nodes are under tmp_path/proc.
    tmp = _tmp(request)
    driver = NvmlDriver(root=tmp, proc_root=tmp / "proc", make_node=_node_or_stand_in)
    # The fake's minor is the card's index; no control node exists under tmp/dev.
    nodes = CardNodes(own=lambda index: (f"/dev/nvidia{index}",))
    hands = LibraryHands(fake, "nvml", busy)
    return Harness("nvml", driver, NODES["nvml"], hands, card_nodes=nodes, slot_gi=nvml_slot_gi)


def _hgml(request: pytest.FixtureRequest) -> Harness:
    node = NODES["hgml"]
    modes = [True] * len(node.partition) + [False] * len(node.sliced)
    rig = thead_rig(_library(request, "hgml"), _tmp(request), _env(request), modes)

    def busy(instance: Instance, on: bool) -> None:
        rig.fake.set_busy(instance.uuid, on)  # HGML knows the partition by its MIG device UUID

    nodes = CardNodes(("/dev/alixpu", "/dev/alixpu_ctl"),
                      lambda index: (f"/dev/alixpu_ppu{index}",))
    hands = LibraryHands(rig.fake, "hgml", busy)
    return Harness("hgml", open_hgml(rig), node, hands, card_nodes=nodes)


def _dmi(request: pytest.FixtureRequest) -> Harness:
    node = NODES["dmi"]
    rig = hygon_rig(_library(request, "dmi"), _tmp(request), _env(request), len(node.partition))

    def busy(instance: Instance, on: bool) -> None:
        rig.fake.set_busy(instance.uuid.removeprefix("MIG-"), on)  # DMI keeps the bare mig_uuid

    # The fake's DRM nodes: card<index + 1> and renderD<128 + index> (fakes.dmi.host_nodes).
    nodes = CardNodes(("/dev/kfd", "/dev/mkfd"),
                      lambda index: (f"/dev/dri/card{index + 1}", f"/dev/dri/renderD{128 + index}"),
                      ("/opt/hyhal",))
    hands = LibraryHands(rig.fake, "nvml", busy)
    return Harness("dmi", open_dmi(rig), node, hands, busy_unknown="no per-partition process query",
                   card_nodes=nodes)


def _library(request: pytest.FixtureRequest, kind: str) -> Path:
    return request.getfixturevalue(f"{kind}_library")  # built once per session, tests/conftest.py


def _tmp(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue("tmp_path")


def _env(request: pytest.FixtureRequest) -> pytest.MonkeyPatch:
    return request.getfixturevalue("monkeypatch")


BUILDERS: dict[str, Callable[[pytest.FixtureRequest], Harness]] = {
    "sim": _sim("sim"), "nvml": _nvml,
    "sim-ppu": _sim("sim-ppu"), "hgml": _hgml,
    "sim-dcu": _sim("sim-dcu"), "dmi": _dmi,
}  # fmt: skip


def probe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`partkeeper probe` in a process of its own, with `env` over this one's."""
    return subprocess.run(
        [sys.executable, "-m", "partkeeper", "probe", *args], env={**os.environ, **env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def active_claim(inst: Instance, cid: str) -> Claim:
    """An active claim holding `inst`, as the allocator records it."""
    claim = make_claim(cid, inst.start, inst.size, card=inst.card, state="active")
    live = LiveInstance(gi_id=inst.gi_id, ci_id=inst.ci_id, uuid=inst.uuid)
    return msgspec.structs.replace(claim, profile=inst.profile, instance=live)
