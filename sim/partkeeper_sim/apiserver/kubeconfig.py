"""A kubeconfig pointing at the simulated API server: plain HTTP, no credentials."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

CONTEXT = "partkeeper-sim"


def kubeconfig(url: str, namespace: str = "default") -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": url}}],
        "users": [{"name": CONTEXT, "user": {}}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace},
            }
        ],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(path: str | os.PathLike[str], url: str, namespace: str = "default") -> Path:
    """Write the kubeconfig atomically (JSON, which is YAML), so a reader never sees half."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(kubeconfig(url, namespace), out, indent=2)
            out.write("\n")
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target
