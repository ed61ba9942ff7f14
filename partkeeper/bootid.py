"""The host's boot id: what tells a reboot from a restart (docs/operations.md, "After a reboot").

The kernel draws a random UUID at each boot and serves it at `/proc/sys/kernel/random/boot_id`
(proc(5); the kubelet and NVIDIA's DRA driver read the same file). Read under `PK_PROC_ROOT`, the
host's `/proc` as the container mounts it, which tests point at a directory of their own.
"""

from __future__ import annotations

import re
from pathlib import Path

RELATIVE = Path("sys/kernel/random/boot_id")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class BootIdError(Exception):
    """The boot id could not be read, or is not one. Never taken as "a new boot"."""


def path(proc_root: Path) -> Path:
    return proc_root / RELATIVE


def parse(text: str, where: Path) -> str:
    """The boot id in the file's text: one lower-case UUID and a newline, as the kernel writes
    it. Anything else is refused with what was found."""
    value = text.strip().lower()
    if not _UUID.match(value):
        raise BootIdError(f"{where} holds {text[:60]!r}, not a boot id (a UUID)")
    return value


def read(proc_root: Path) -> str:
    """The host's boot id. Raises BootIdError naming the file when it is missing or malformed."""
    where = path(proc_root)
    try:
        text = where.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise BootIdError(f"cannot read the boot id at {where}: {exc.strerror or exc}") from exc
    return parse(text, where)


def write(proc_root: Path, boot_id: str) -> None:
    """Write a boot id under `proc_root` as the kernel shows it: for the simulator and tests,
    which stand in for the host's `/proc` (`partkeeper up`, `partkeeper sim reboot`)."""
    value = parse(boot_id, path(proc_root))
    target = path(proc_root)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(value + "\n", encoding="ascii")
    tmp.replace(target)
