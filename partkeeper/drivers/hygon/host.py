"""The Hygon driver's files on the host: the DMI registry, sysfs, and what a container gets.

The registry `/etc/dmi_mig_config` is the driver's own record, and the only source of two facts
the library does not answer for: `dev<N>` (one line, the card's domain-qualified PCI bus id) and
`ci/dev<N>gi<G>ci<C>.conf` (a partition's identity, its `mig_uuid:` line, issued afresh on every
create). A container runtime asked to bind a conf file that no longer exists creates a directory
there, and the driver can then never write that record again (the create fails with
INSUFFICIENT_RESOURCES): `leftovers` finds such empty directories and `remove_leftover` takes one
away (rmdir: never a file, never a non-empty directory, never through a symlink).

A partition's container gets the card's device nodes, /opt/hyhal, its record and
`DMI_MIG_VISIBLE_DEVICE`; whole cards (the node-wide mode off, handed over for their logical
slices) get the device nodes and /opt/hyhal only, since no partition is named.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from partkeeper.devices import DeviceNode
from partkeeper.drivers.base import ContainerEdits, HostMount, Instance, ReadError

REGISTRY = "/etc/dmi_mig_config"
HYHAL = "/opt/hyhal"
CONTROL_NODES = ("/dev/kfd", "/dev/mkfd")
DRI_DIR = "/dev/dri"  # the card's card<N> and renderD<M>
PCI_DEVICES = "/sys/bus/pci/devices"  # per card: unique_id, drm/
VISIBLE_ENV = "DMI_MIG_VISIBLE_DEVICE"
Where = tuple[int | None, str | None]  # the card and the instance a refusal names
_PCI = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def host(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def conf_record(card: int, gi_id: int, ci_id: int) -> str:
    return f"{REGISTRY}/ci/dev{card}gi{gi_id}ci{ci_id}.conf"


def pci_bus_id(root: Path, card: int) -> str:
    """The card's PCI bus id from `dev<N>`; a missing or malformed file is a ReadError."""
    path = host(root, f"{REGISTRY}/dev{card}")
    try:
        value = path.read_text().strip()
    except OSError as exc:
        cause = f"cannot read the card's PCI address from {REGISTRY}/dev{card}: {exc.strerror}"
        raise ReadError("list", card, None, cause) from exc
    if not _PCI.match(value):
        cause = f"{REGISTRY}/dev{card} holds {value!r}, not a domain-qualified PCI bus id"
        raise ReadError("list", card, None, cause)
    return value


def card_uuid(root: Path, card: int, pci: str) -> str:
    """`GPU-` + the card's unique id, the one ROCm SMI reports (sysfs `unique_id`)."""
    path = host(root, f"{PCI_DEVICES}/{pci}/unique_id")
    try:
        unique = path.read_text().strip().lower().removeprefix("0x")
    except OSError as exc:
        cause = f"cannot read the unique id of {pci} ({exc.strerror})"
        raise ReadError("list", card, None, cause) from exc
    if not unique:
        raise ReadError("list", card, None, f"the unique id of {pci} is empty")
    return f"GPU-{unique}"


def read_uuid(root: Path, inst: tuple[int, int, int], op: str) -> str:
    """`MIG-` + the `mig_uuid:` line of the partition's conf record (fails closed)."""
    card, gi_id, ci_id = inst
    record = conf_record(card, gi_id, ci_id)
    try:
        lines = host(root, record).read_text().splitlines()
    except OSError as exc:
        cause = f"cannot read the partition record {record}: {exc.strerror}"
        raise ReadError(op, card, None, cause) from exc
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "mig_uuid" and value.strip():
            return f"MIG-{value.strip()}"
    raise ReadError(op, card, None, f"the partition record {record} carries no mig_uuid")


def leftovers(root: Path) -> list[str]:
    """Registry paths (container paths) where a directory sits in place of a conf record."""
    ci = host(root, f"{REGISTRY}/ci")
    try:
        entries = sorted(os.scandir(ci), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ReadError("list", None, None, f"cannot list {REGISTRY}/ci: {exc.strerror}") from exc
    return [
        f"{REGISTRY}/ci/{e.name}"
        for e in entries
        if e.name.endswith(".conf") and e.is_dir(follow_symlinks=False)
    ]


def remove_leftover(root: Path, record: str) -> None:
    """rmdir the directory squatting on `record`; refuses anything else, naming why."""
    if not record.startswith(f"{REGISTRY}/ci/") or "/" in record.removeprefix(f"{REGISTRY}/ci/"):
        raise ValueError(f"{record} is not a record path under {REGISTRY}/ci")
    path = host(root, record)
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise ValueError(
            f"{record} is not a directory; only a directory squatting there is removed"
        )
    os.rmdir(path)  # OSError (ENOTEMPTY) if anything is inside: then it is left for a person


def _drm_nodes(root: Path, where: Where, pci: str) -> list[str]:
    drm = host(root, f"{PCI_DEVICES}/{pci}/drm")
    try:
        names = sorted(os.listdir(drm))
    except OSError as exc:
        cause = f"cannot list the DRM nodes of {pci} ({exc.strerror})"
        raise ReadError("allocate", *where, cause) from exc
    card = [n for n in names if re.fullmatch(r"card\d+", n)]
    render = [n for n in names if re.fullmatch(r"renderD\d+", n)]
    if len(card) != 1 or len(render) != 1:
        cause = f"{pci} has DRM nodes {names}, not one card<N> and one renderD<M>"
        raise ReadError("allocate", *where, cause)
    return [f"{DRI_DIR}/{card[0]}", f"{DRI_DIR}/{render[0]}"]


def _node(root: Path, path: str, where: Where) -> DeviceNode:
    at = host(root, path)
    try:
        mode = os.stat(at).st_mode
    except OSError as exc:
        raise ReadError("allocate", *where, f"device node {path} is missing") from exc
    if not stat.S_ISCHR(mode):
        raise ReadError("allocate", *where, f"{path} is not a character device")
    return DeviceNode(path, str(at))


def card_edits(
    root: Path, cards: Sequence[tuple[int, str]], name: str | None = None
) -> ContainerEdits:
    """What a container needs for whole cards, given as (index, PCI bus id), as Hygon's device
    plugin hands them: `/dev/kfd` and `/dev/mkfd` once, each card's DRM nodes, and /opt/hyhal
    read-only where the host has it. `name`: the partition a refusal names, if any."""
    first = (cards[0][0] if cards else None, name)
    devices = [_node(root, p, first) for p in CONTROL_NODES]
    for index, pci in cards:
        where = (index, name)
        devices += [_node(root, p, where) for p in _drm_nodes(root, where, pci)]
    hyhal = host(root, HYHAL)
    mounts = (HostMount(HYHAL, str(hyhal)),) if hyhal.is_dir() else ()
    return ContainerEdits(devices=tuple(devices), mounts=mounts)


def edits(root: Path, inst: Instance, pci: str) -> ContainerEdits:
    """The card's hand-off (`card_edits`), the conf record read-only at its own path (the runtime
    scans that directory by absolute path), and `DMI_MIG_VISIBLE_DEVICE=MIG-<uuid>`."""
    record = conf_record(inst.card, inst.gi_id, inst.ci_id)
    where = host(root, record)
    if inst.ci_id < 0 or not where.is_file() or where.is_symlink():
        cause = (
            f"the partition record {record} is not a file; binding it would make the "
            "runtime create a directory there"
        )
        raise ReadError("allocate", inst.card, inst.uuid or f"GI {inst.gi_id}", cause)
    whole = card_edits(root, [(inst.card, pci)], inst.uuid)
    return ContainerEdits(
        env={VISIBLE_ENV: inst.uuid}, devices=whole.devices,
        mounts=(*whole.mounts, HostMount(record, str(where))),
    )
