"""CDI specs of created partitions (Container Device Interface, cdiVersion 0.6.0).

With `PK_DEVICE_LIST_STRATEGY=cdi` the allocator writes one spec per partition into `PK_CDI_DIR`
under the kind `partkeeper.io/partition`, the device named by its claim id (unique for the life of
the claim, unlike a MIG UUID, which a successor at the same slot reproduces), and returns the
qualified name in the Allocate response's `cdi_devices`. The spec's container edits are the
driver's for that partition (NVIDIA's: `NVIDIA_VISIBLE_DEVICES=<MIG uuid as the driver reports
it>` and the device nodes, each with `type: c`, major and minor where the driver knows them) plus
`PK_CLAIM_IDS` and `PK_POD_UID`. The reclaimer removes the spec
once the destroy is confirmed, before the claim goes.

Pure builders plus two file operations (an atomic write, a removal); nothing else here.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from partkeeper.devices import DeviceNode
from partkeeper.drivers.base import ContainerEdits

CDI_VERSION = "0.6.0"
VENDOR = "partkeeper.io"
CLASS = "partition"
KIND = f"{VENDOR}/{CLASS}"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


class CdiError(Exception):
    """A spec could not be written or removed; the message names the file and the cause."""


def qualified(claim_id: str) -> str:
    return f"{KIND}={claim_id}"


def spec_path(cdi_dir: Path, claim_id: str) -> Path:
    if not _NAME.match(claim_id):
        raise CdiError(f"claim id {claim_id!r} is not a valid CDI device name")
    return cdi_dir / f"{VENDOR}-{CLASS}_{claim_id}.json"


def spec_for(
    claim_id: str, mig_uuid: str, edits: ContainerEdits, env: Mapping[str, str]
) -> dict[str, Any]:
    """The CDI spec of one partition (deterministic: the same inputs give the same bytes).

    `edits` are the driver's container edits for that partition alone (NVIDIA's
    `NVIDIA_VISIBLE_DEVICES` and device specs, T-Head's nodes, Hygon's nodes, mounts and
    `DMI_MIG_VISIBLE_DEVICE`); `env` the `PK_*` variables added after the driver's."""
    extra = [f"{k}={v}" for k, v in sorted(env.items())]
    container: dict[str, Any] = {
        "env": [*(f"{k}={v}" for k, v in edits.env.items()), *extra],
        "deviceNodes": [_node(n) for n in edits.devices],
    }
    if edits.mounts:
        container["mounts"] = [
            {"containerPath": m.container_path, "hostPath": m.host_path,
             "options": ["ro", "bind"] if m.read_only else ["rw", "bind"]}
            for m in edits.mounts
        ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "annotations": {f"{VENDOR}/mig-uuid": mig_uuid},
        "devices": [{"name": claim_id, "containerEdits": container}],
    }


def _node(n: DeviceNode) -> dict[str, Any]:
    """A deviceNode; with its numbers known, also `type: c`, major and minor, so the runtime
    makes the node in the container without a host node to stat (container-device-interface,
    pkg/cdi/container-edits.go fillMissingInfo: a node with Type and Major is complete)."""
    node: dict[str, Any] = {"path": n.container_path, "hostPath": n.host_path,
                            "permissions": n.permissions}
    if n.major is not None and n.minor is not None:
        node.update(type="c", major=n.major, minor=n.minor)
    return node


def write_spec(cdi_dir: Path, claim_id: str, spec: dict[str, Any]) -> Path:
    """Write the spec atomically (a reader sees the old file or the new one, never half)."""
    path = spec_path(cdi_dir, claim_id)
    body = json.dumps(spec, indent=2, sort_keys=True).encode()
    try:
        cdi_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cdi_dir, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(body)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o644)  # the container runtime reads it
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise CdiError(f"cannot write CDI spec {path}: {exc.strerror or exc}") from exc
    return path


def remove_spec(cdi_dir: Path, claim_id: str) -> bool:
    """Remove the claim's spec; False when there was none. Raises CdiError."""
    path = spec_path(cdi_dir, claim_id)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CdiError(f"cannot remove CDI spec {path}: {exc.strerror or exc}") from exc
    return True
