"""Names inside PK_PODS_DIR: validation of every token that becomes a path component.

Layout (docs/contract.md section 5):

    <root>/<podUID>/c-<container>/partition-<MIG uuid>.json   allocator writes, reclaimer removes
    <root>/<podUID>/c-<container>/sliced/                      allocator writes, only the GC removes
    <root>/<podUID>/c-<container>/sliced/.partkeeper-owned     the ownership mark

Nothing here touches the filesystem. Every name is validated before a path is built from it, so a
Pod UID, container name or MIG UUID can never carry a separator, `..` or a NUL.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from schemas.pods import InvalidPodUID, validate_pod_uid

CONTAINER_PREFIX = "c-"
DESCRIPTOR_PREFIX = "partition-"
DESCRIPTOR_SUFFIX = ".json"
SLICED = "sliced"
MARK = ".partkeeper-owned"
MARK_OWNER = "partkeeper-allocator"
MARK_MAX_BYTES = 4096
TEMP_PREFIX = ".tmp-"

DIR_MODE = 0o750
FILE_MODE = 0o640

# Kubernetes container names are DNS-1123 labels.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A token that is one path component and nothing else: starts alphanumeric (so never "." or ".."
# or hidden), then letters, digits, '.', '_', '-'.
_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class WorkdirError(Exception):
    """A working-directory operation failed; `path` says where and `reason` why."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


class InvalidName(WorkdirError, ValueError):
    """A Pod UID, container name, MIG UUID or file name that must not become a path component."""


class UnsafePath(WorkdirError):
    """Going on would follow a link, cross a mount or touch something that is not ours."""


def check_uid(root: Path | str, uid: object) -> str:
    try:
        return validate_pod_uid(uid)
    except InvalidPodUID as exc:
        raise InvalidName(Path(root), f"refusing to build a path: {exc}") from exc


def check_container(root: Path | str, container: object) -> str:
    if not isinstance(container, str) or not _DNS_LABEL.fullmatch(container):
        raise InvalidName(
            Path(root),
            f"refusing to build a path: container name {container!r} is not a DNS-1123 label",
        )
    return container


def check_token(root: Path | str, token: object, what: str) -> str:
    if not isinstance(token, str) or not _SAFE_TOKEN.fullmatch(token):
        raise InvalidName(
            Path(root),
            f"refusing to build a path: {what} {token!r} is not a safe file name "
            "(letters, digits, '.', '_', '-'; starting with a letter or digit; at most 128)",
        )
    return token


def container_entry(container: str) -> str:
    return f"{CONTAINER_PREFIX}{container}"


def container_of(entry: str) -> str | None:
    """The container name a `c-<name>` directory entry stands for, or None if it is not one."""
    if not entry.startswith(CONTAINER_PREFIX):
        return None
    name = entry[len(CONTAINER_PREFIX) :]
    return name if _DNS_LABEL.fullmatch(name) else None


def descriptor_entry(mig_uuid: str) -> str:
    return f"{DESCRIPTOR_PREFIX}{mig_uuid}{DESCRIPTOR_SUFFIX}"


def is_descriptor_entry(entry: str) -> bool:
    if not (entry.startswith(DESCRIPTOR_PREFIX) and entry.endswith(DESCRIPTOR_SUFFIX)):
        return False
    token = entry[len(DESCRIPTOR_PREFIX) : -len(DESCRIPTOR_SUFFIX)]
    return bool(_SAFE_TOKEN.fullmatch(token))




def pod_dir(root: Path | str, uid: str) -> Path:
    """`<root>/<uid>`, after validating the UID."""
    return Path(root) / check_uid(root, uid)


def container_dir(root: Path | str, uid: str, container: str) -> Path:
    """`<root>/<uid>/c-<container>`, after validating both names."""
    return pod_dir(root, uid) / container_entry(check_container(root, container))


def sliced_dir(root: Path | str, uid: str, container: str) -> Path:
    return container_dir(root, uid, container) / SLICED


def descriptor_path(root: Path | str, uid: str, container: str, mig_uuid: str) -> Path:
    token = check_token(root, mig_uuid, "MIG UUID")
    return container_dir(root, uid, container) / descriptor_entry(token)


def mark_body(uid: str, container: str) -> bytes:
    return json.dumps({"owner": MARK_OWNER, "pod_uid": uid, "container": container}).encode()


def mark_matches(body: bytes, uid: str, container: str) -> bool:
    """True only for a mark naming exactly this Pod and container, written by the allocator."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return parsed == {"owner": MARK_OWNER, "pod_uid": uid, "container": container}
