"""The device nodes a container needs for a MIG partition or a whole card, as NVIDIA's device
plugin hands them, and the capability nodes made before a reply names them.

A whole card is its node `/dev/nvidia<minor>`. A MIG device is reached through three nodes: the
parent card and the two MIG capability nodes of its GPU and compute instance
(`/dev/nvidia-caps/nvidia-cap<minor>`), whose minors the kernel driver publishes in
`/proc/driver/nvidia/capabilities/gpu<card minor>/mig/gi<G>/access` and `.../gi<G>/ci<C>/access`
(`DeviceFileMinor: <n>`, `DeviceFileMode: <decimal mode>`). The control nodes (`/dev/nvidiactl`,
`/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset`) are added where they exist. Host
paths are under the driver root (`PK_DRIVER_ROOT`, `/` unless the driver is installed in a
container), the proc files under `PK_PROC_ROOT`; container paths are the plain `/dev/...` paths.

The kernel driver publishes a capability file when the instance is created, but makes no node:
only nvidia-modprobe (or the container toolkit's hook, which runs after the container runtime has
resolved the device specs) does, and containerd fails a container whose device spec names a
missing host path. So before a capability node is named it is made here as nvidia-modprobe makes
it (modprobe-utils/nvidia-modprobe-utils.c: nvidia_cap_mknod, mknod_helper): `/dev/nvidia-caps`
with mode 0755, a character device with the major of `nvidia-caps` in `/proc/devices` and the
file's minor and mode; a node of another type or number is removed and made again. Every node
also carries its type, major and minor, so a CDI spec needs no host node at all (NVIDIA's DRA
driver does the same: internal/common/nvcaps.go, CDICharDevNode).

What stays the NVIDIA container toolkit's job: the driver's user-space libraries and binaries
(libcuda, libnvidia-ml, nvidia-smi) are not mounted from here. docs/drivers.md says more.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CONTROL_NODES = (
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
)  # fmt: skip
# nvidia-modprobe-utils.h: NV_MAJOR_DEVICE_NUMBER, NV_CTL_DEVICE_NUM, NV_MODESET_MINOR_DEVICE_NUM;
# nvidia-uvm has a dynamic major, minors 0 (uvm) and 1 (uvm-tools) (nvidia_uvm_mknod).
NVIDIA_MAJOR = 195
_FIXED = {"/dev/nvidiactl": (NVIDIA_MAJOR, 255), "/dev/nvidia-modeset": (NVIDIA_MAJOR, 254)}
_UVM = {"/dev/nvidia-uvm": 0, "/dev/nvidia-uvm-tools": 1}
CAPS_MODULE = "nvidia-caps"
CAPS_DIR = "/dev/nvidia-caps"
CAPS_DIR_MODE = 0o755
DEFAULT_MODE = 0o666  # nvidia-modprobe's NV_DEVICE_FILE_MODE, for a file without DeviceFileMode
_FIELD = re.compile(r"^(DeviceFileMinor|DeviceFileMode|DeviceFileModify):\s*(\d+)\s*$",
                    re.MULTILINE)

MakeNode = Callable[[str, int, int], None]  # os.mknod's (path, mode, device)


class DeviceNodeError(Exception):
    """A capability file is missing or unreadable, or a node cannot be made: the partition's
    nodes cannot be handed over. The message names the file or node and why."""


@dataclass(frozen=True, slots=True)
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"
    # A character device's numbers, where known: a CDI deviceNode with type "c", major and minor
    # needs no host node (container-device-interface, pkg/cdi/container-edits.go fillMissingInfo
    # stats hostPath only when they are missing).
    major: int | None = None
    minor: int | None = None


@dataclass(frozen=True, slots=True)
class Roots:
    driver_root: Path = Path("/")
    proc_root: Path = Path("/proc")
    # How a node is made: os.mknod, which needs CAP_MKNOD; tests without it hand another.
    make_node: MakeNode = field(default=os.mknod, compare=False)

    def host(self, path: str) -> str:
        return str(self.driver_root / path.lstrip("/"))


@dataclass(frozen=True, slots=True)
class Capability:
    """What one capability file says: the node's minor and mode, and whether its node may be made
    (`DeviceFileModify: 0`, the driver's ModifyDeviceFiles off: nvidia-modprobe leaves it)."""

    path: Path
    minor: int
    mode: int
    modify: bool = True


def capability_file(roots: Roots, card_minor: int, gi_id: int, ci_id: int | None = None) -> Path:
    base = roots.proc_root / "driver/nvidia/capabilities" / f"gpu{card_minor}/mig/gi{gi_id}"
    return (base / f"ci{ci_id}" if ci_id is not None else base) / "access"


def read_capability(path: Path) -> Capability:
    """The `DeviceFileMinor` and `DeviceFileMode` of one capability file. Raises
    DeviceNodeError."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise DeviceNodeError(f"cannot read MIG capability {path}: {exc.strerror}") from exc
    fields = dict(_FIELD.findall(text))
    if "DeviceFileMinor" not in fields:
        raise DeviceNodeError(f"MIG capability {path} names no DeviceFileMinor")
    mode = int(fields.get("DeviceFileMode", DEFAULT_MODE)) & 0o777
    modify = fields.get("DeviceFileModify", "1") == "1"
    return Capability(path, int(fields["DeviceFileMinor"]), mode, modify)


def capability_minor(path: Path) -> int:
    """The `DeviceFileMinor` of one capability file. Raises DeviceNodeError."""
    return read_capability(path).minor


def char_major(roots: Roots, name: str) -> int | None:
    """The major of character device `name` in `<proc root>/devices`, None when it is not listed.

    As nvidia-modprobe reads it (nvidia_get_chardev_major): the "Character devices:" section only,
    and the whole name, so `nvidia-caps` never matches `nvidia-caps-imex-channels`. Raises
    DeviceNodeError when the file cannot be read."""
    path = roots.proc_root / "devices"
    try:
        text = path.read_text()
    except OSError as exc:
        raise DeviceNodeError(f"cannot read {path}: {exc.strerror}") from exc
    _, found, chars = text.partition("Character devices:\n")
    for line in chars.split("\n") if found else ():
        if not line:
            break  # the empty line that ends the section
        number, _, module = line.strip().partition(" ")
        if module.strip() == name and number.isdigit():
            return int(number)
    return None


def _node_is(path: Path, major: int, minor: int) -> bool | None:
    """Whether `path` itself is that character device (lstat: a link is never followed, and is
    not the node): None when nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    device = os.makedev(major, minor)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == device


def _no_link_between(root: Path, path: Path) -> None:
    """Raise OSError(ELOOP) when a directory between the driver root and `path` is a link: the
    node would be made wherever it points on the host (the root itself may be one, as
    /run/nvidia/driver is)."""
    here = root
    for part in path.relative_to(root).parts[:-1]:
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.ELOOP, "a link or no directory stands where a directory must",
                          str(here))


def _set_mode(path: Path, major: int, minor: int, mode: int) -> None:
    """chmod the node itself, never what a link put there meanwhile points at: opened with
    O_PATH|O_NOFOLLOW and checked by fstat, its mode set through that descriptor (fchmod takes
    no O_PATH descriptor; /proc/self/fd/N names exactly the opened inode, and opening the node
    for reading would call into the driver)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not (stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(major, minor)):
            raise OSError(errno.ELOOP, "not the device node (a link or another file)",
                          str(path))
        if stat.S_IMODE(st.st_mode) != mode:
            os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def ensure_node(roots: Roots, path: str, major: int, minor: int, mode: int) -> None:
    """Make `path` (a container path, made under the driver root) the character device
    major:minor with `mode`, as nvidia-modprobe's mknod_helper does. Raises DeviceNodeError."""
    at = Path(roots.host(path))
    what = f"{path} (character device {major}:{minor}, mode {mode:04o}) under {roots.driver_root}"
    try:
        # Never through a link: not in the directories (the node would be made elsewhere on
        # the host), not at the node (a link is replaced, never followed, never chmodded).
        _no_link_between(Path(roots.driver_root), at)
        state = _node_is(at, major, minor)
        if state is False:
            at.unlink()  # another type or number, or a link: removed and made again
        if not state:
            if not at.parent.is_dir():
                at.parent.mkdir(mode=CAPS_DIR_MODE, parents=True, exist_ok=True)
                _no_link_between(Path(roots.driver_root), at)
            try:
                roots.make_node(str(at), stat.S_IFCHR | mode, os.makedev(major, minor))
            except FileExistsError:
                if not _node_is(at, major, minor):  # a concurrent hand-over made it first
                    raise
        _set_mode(at, major, minor, mode)  # mknod applies the umask; the node's mode counts
    except OSError as exc:
        cause = exc.strerror or str(exc)
        hint = "; the allocator needs CAP_MKNOD" if exc.errno == errno.EPERM else ""
        raise DeviceNodeError(f"cannot create {what}: {cause}{hint}") from exc


def _nodes(roots: Roots, paths: list[DeviceNode]) -> list[DeviceNode]:
    """The control nodes present under the driver root, then `paths`."""
    present = [p for p in CONTROL_NODES if Path(roots.host(p)).exists()]
    return [_control(roots, p) for p in present] + paths


def _control(roots: Roots, path: str) -> DeviceNode:
    if path in _FIXED:
        major, minor = _FIXED[path]
        return DeviceNode(path, roots.host(path), major=major, minor=minor)
    uvm = char_major(roots, "nvidia-uvm") if (roots.proc_root / "devices").exists() else None
    if uvm is None:
        return DeviceNode(path, roots.host(path))  # numbers unknown: CDI reads the host node
    return DeviceNode(path, roots.host(path), major=uvm, minor=_UVM[path])


def _card(roots: Roots, card_minor: int) -> DeviceNode:
    path = f"/dev/nvidia{card_minor}"
    return DeviceNode(path, roots.host(path), major=NVIDIA_MAJOR, minor=card_minor)


def _cap_node(roots: Roots, cap: Capability, major: int) -> DeviceNode:
    path = f"{CAPS_DIR}/nvidia-cap{cap.minor}"
    return DeviceNode(path, roots.host(path), major=major, minor=cap.minor)


def _capabilities(
    roots: Roots, card_minor: int, gi_id: int, ci_id: int
) -> tuple[list[Capability], int]:
    """The GI's and the CI's capability, and the nvidia-caps major. Raises DeviceNodeError."""
    gi = read_capability(capability_file(roots, card_minor, gi_id))
    ci = read_capability(capability_file(roots, card_minor, gi_id, ci_id))
    major = char_major(roots, CAPS_MODULE)
    if major is None:
        where = roots.proc_root / "devices"
        raise DeviceNodeError(f"{where} lists no {CAPS_MODULE} character device (is the "
                              "nvidia kernel module loaded?)")
    return [gi, ci], major


def planned_nodes(roots: Roots, card_minor: int, gi_id: int, ci_id: int) -> list[DeviceNode]:
    """The nodes a reply would name for the MIG device, making none (`partkeeper probe --check`).
    Raises DeviceNodeError."""
    caps, major = _capabilities(roots, card_minor, gi_id, ci_id)
    return _nodes(roots, [_card(roots, card_minor), *(_cap_node(roots, c, major) for c in caps)])


def partition_nodes(roots: Roots, card_minor: int, gi_id: int, ci_id: int) -> list[DeviceNode]:
    """Every node the container needs for the MIG device (card, GI, CI), the two capability
    nodes made where missing. Raises DeviceNodeError."""
    caps, major = _capabilities(roots, card_minor, gi_id, ci_id)
    made = [_cap_node(roots, c, major) for c in caps]
    for cap, node in zip(caps, made, strict=True):
        if cap.modify:
            ensure_node(roots, node.container_path, major, cap.minor, cap.mode)
        elif (found := node_state(node)) != "ok":
            raise DeviceNodeError(f"{node.container_path} under {roots.driver_root} is {found}, "
                                  f"and {cap.path} says DeviceFileModify: 0 (the driver's "
                                  "ModifyDeviceFiles is off), so it is not made here")
    return _nodes(roots, [_card(roots, card_minor), *made])


def node_state(node: DeviceNode) -> str:
    """What is at a node's host path, read-only: "ok", "missing", or what is there instead."""
    try:
        st = os.lstat(node.host_path)
    except FileNotFoundError:
        return "missing"
    if not stat.S_ISCHR(st.st_mode):
        return "not a character device"
    found = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if node.major is not None and found != (node.major, node.minor):
        return f"character device {found[0]}:{found[1]}, not {node.major}:{node.minor}"
    return "ok"


def card_nodes(roots: Roots, card_minors: Sequence[int]) -> list[DeviceNode]:
    """Every node a container needs for these whole cards: the control nodes once, then each
    card's `/dev/nvidia<minor>` (what the device plugin passes for a full GPU)."""
    return _nodes(roots, [_card(roots, m) for m in card_minors])
