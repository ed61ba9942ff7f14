"""The device nodes a container needs for a MIG partition or a whole card, as NVIDIA's device
plugin hands them.

A whole card is its node `/dev/nvidia<minor>`. A MIG device is reached through three nodes: the
parent card and the two MIG capability nodes of its GPU and compute instance
(`/dev/nvidia-caps/nvidia-cap<minor>`), whose minors the kernel driver publishes in
`/proc/driver/nvidia/capabilities/gpu<card minor>/mig/gi<G>/access` and `.../gi<G>/ci<C>/access`
(`DeviceFileMinor: <n>`). The control nodes (`/dev/nvidiactl`, `/dev/nvidia-uvm`,
`/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset`) are added where they exist. Host paths are under
the driver root (`PK_DRIVER_ROOT`, `/` unless the driver is installed in a container), the proc
files under `PK_PROC_ROOT`; container paths are the plain `/dev/...` paths.

What stays the NVIDIA container toolkit's job: the driver's user-space libraries and binaries
(libcuda, libnvidia-ml, nvidia-smi) are not mounted from here. docs/drivers.md says more.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CONTROL_NODES = (
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
)  # fmt: skip
_MINOR = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)


class DeviceNodeError(Exception):
    """A capability file is missing or unreadable: the partition's nodes cannot be named."""


@dataclass(frozen=True, slots=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class Roots:
    driver_root: Path = Path("/")
    proc_root: Path = Path("/proc")

    def host(self, path: str) -> str:
        return str(self.driver_root / path.lstrip("/"))


def capability_file(roots: Roots, card_minor: int, gi_id: int, ci_id: int | None = None) -> Path:
    base = roots.proc_root / "driver/nvidia/capabilities" / f"gpu{card_minor}/mig/gi{gi_id}"
    return (base / f"ci{ci_id}" if ci_id is not None else base) / "access"


def capability_minor(path: Path) -> int:
    """The `DeviceFileMinor` of one capability file. Raises DeviceNodeError."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise DeviceNodeError(f"cannot read MIG capability {path}: {exc.strerror}") from exc
    found = _MINOR.search(text)
    if found is None:
        raise DeviceNodeError(f"MIG capability {path} names no DeviceFileMinor")
    return int(found.group(1))


def _nodes(roots: Roots, paths: list[str]) -> list[DeviceNode]:
    """The control nodes present under the driver root, then `paths`."""
    present = [p for p in CONTROL_NODES if Path(roots.host(p)).exists()]
    return [DeviceNode(p, roots.host(p)) for p in present + paths]


def _card(card_minor: int) -> str:
    return f"/dev/nvidia{card_minor}"


def partition_nodes(roots: Roots, card_minor: int, gi_id: int, ci_id: int) -> list[DeviceNode]:
    """Every node the container needs for the MIG device (card, GI, CI). Raises DeviceNodeError."""
    gi_minor = capability_minor(capability_file(roots, card_minor, gi_id))
    ci_minor = capability_minor(capability_file(roots, card_minor, gi_id, ci_id))
    return _nodes(roots, [_card(card_minor), f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
                          f"/dev/nvidia-caps/nvidia-cap{ci_minor}"])


def card_nodes(roots: Roots, card_minors: Sequence[int]) -> list[DeviceNode]:
    """Every node a container needs for these whole cards: the control nodes once, then each
    card's `/dev/nvidia<minor>` (what the device plugin passes for a full GPU)."""
    return _nodes(roots, [_card(m) for m in card_minors])
