"""What a container gets for a T-Head PPU partition or whole PPUs: device nodes, nothing else.

T-Head has no runtime hook, so visibility is the nodes themselves: the shared control nodes
`/dev/alixpu` and `/dev/alixpu_ctl`, the PPU's `/dev/alixpu_ppu<ordinal>`, and for a partition the
capability nodes of its GI and CI, `/dev/alixpu-caps/alixpu-cap<minor>`, their minors read (never
computed) from `DeviceFileMinor:` in the driver's procfs records
`/proc/driver/alixpu/capabilities/ppu<ordinal>/mig/gi<G>/access` and `.../gi<G>/ci<C>/access`.
A whole PPU (a card not in partition mode, handed over for its logical slices) is the control
nodes and its own node, as the vendor's device plugin hands whole cards.

Every node is required and checked: missing, not a character device, or the wrong minor refuses the
allocation. The PPU node's minor must be the one HGML reports for the card: the ordinal names the
path, and a path built from the wrong number addresses the next PPU.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from partkeeper.devices import DeviceNode
from partkeeper.drivers.base import ContainerEdits, Instance, ReadError

CONTROL_NODES = ("/dev/alixpu", "/dev/alixpu_ctl")
PPU_NODE = "/dev/alixpu_ppu"  # + the ordinal
CAPS_DIR = "/dev/alixpu-caps"  # the capability nodes, made with each instance
PROC_CAPABILITIES = "/proc/driver/alixpu/capabilities"
_MINOR = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)
Where = tuple[int | None, str | None]  # the card and the instance a refusal names


def host(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def capability_record(ordinal: int, gi_id: int, ci_id: int | None = None) -> str:
    base = f"{PROC_CAPABILITIES}/ppu{ordinal}/mig/gi{gi_id}"
    return f"{base}/access" if ci_id is None else f"{base}/ci{ci_id}/access"


def read_minor(proc_root: Path, record: str, where: Where) -> int:
    """The `DeviceFileMinor` of a procfs record (`/proc/...`, read under `proc_root`)."""
    path = proc_root / record.removeprefix("/proc/")
    try:
        found = _MINOR.search(path.read_text())
    except OSError as exc:
        cause = f"cannot read the capability record {record}: {exc.strerror}"
        raise ReadError("allocate", *where, cause) from exc
    if found is None:
        cause = f"the capability record {record} has no DeviceFileMinor line"
        raise ReadError("allocate", *where, cause)
    return int(found[1])


def require_node(
    root: Path, path: str, where: Where, minor: int | None = None, permissions: str = "rw"
) -> DeviceNode:
    """The node at `path`, checked to be a character device (with `minor`, when given)."""
    at = host(root, path)
    try:
        st = os.stat(at)
    except OSError as exc:
        raise ReadError("allocate", *where, f"device node {path} is missing") from exc
    if not stat.S_ISCHR(st.st_mode):
        raise ReadError("allocate", *where, f"{path} is not a character device")
    if minor is not None and os.minor(st.st_rdev) != minor:
        cause = (
            f"{path} has minor {os.minor(st.st_rdev)}, but the card reports {minor}; "
            "refusing to hand over a node that may be another PPU's"
        )
        raise ReadError("allocate", *where, cause)
    return DeviceNode(path, str(at), permissions)


def ppu_nodes(root: Path, cards: Sequence[tuple[int, int]], name: str | None) -> list[DeviceNode]:
    """The control nodes once, then each PPU's own node, for `cards` as (ordinal, minor HGML
    reports): the ordinal names the path, the minor must match it."""
    first = cards[0][0] if cards else None
    nodes = [require_node(root, path, (first, name)) for path in CONTROL_NODES]
    nodes += [require_node(root, f"{PPU_NODE}{o}", (o, name), minor) for o, minor in cards]
    return nodes


def edits(root: Path, proc_root: Path, inst: Instance, card_minor: int) -> ContainerEdits:
    """The device nodes for one partition on PPU `inst.card` (its ordinal): host paths under
    `root` (the driver root), capability records read under `proc_root`."""
    where = (inst.card, inst.uuid or f"GI {inst.gi_id}")
    if inst.ci_id < 0:
        cause = "the GPU instance has no compute instance, so there is nothing to hand over"
        raise ReadError("allocate", *where, cause)
    nodes = ppu_nodes(root, [(inst.card, card_minor)], where[1])
    for record in (
        capability_record(inst.card, inst.gi_id),
        capability_record(inst.card, inst.gi_id, inst.ci_id),
    ):
        minor = read_minor(proc_root, record, where)
        path = f"{CAPS_DIR}/alixpu-cap{minor}"
        nodes.append(require_node(root, path, where, minor, permissions="r"))
    return ContainerEdits(devices=tuple(nodes))


def card_edits(root: Path, cards: Sequence[tuple[int, int]]) -> ContainerEdits:
    """The device nodes for whole PPUs, given as (ordinal, minor HGML reports): no capability
    node, since no partition is handed over."""
    return ContainerEdits(devices=tuple(ppu_nodes(root, cards, None)))
