"""Whether a DRA workload on this node gets NVIDIA's driver libraries: `partkeeper probe`'s check.

A partition's CDI spec carries only what identifies it: the device nodes and
`NVIDIA_VISIBLE_DEVICES=<MIG uuid>` (partkeeper/cdi.py). NVIDIA's CDI specs of the toolkit and of
its DRA driver do the same, and leave the user-space driver (libcuda, libnvidia-ml, the
utilities) to the NVIDIA Container Toolkit: either the NVIDIA runtime class
(`runtimeClassName: nvidia`; nvidia-container-runtime reads `NVIDIA_VISIBLE_DEVICES` and mounts
the libraries) or the toolkit's own CDI spec (`nvidia-ctk cdi generate`, kind `nvidia.com/gpu`),
whose `createContainer` hooks (`nvidia-cdi-hook`) and mounts bring them. Under plain runc with
neither, the container sees the device nodes and no library to drive them.

From the node the probe can see the CDI directories (the DRA component mounts PK_CDI_DIR), not
the cluster's RuntimeClasses: it reports the toolkit's spec when one is there and otherwise says
what a workload must use. Only the nvml driver needs this; other vendors' edits carry their
libraries' mounts themselves (docs/drivers.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TOOLKIT_KIND = "nvidia.com/gpu"
STATIC_CDI_DIR = Path("/etc/cdi")


# A YAML spec's top-level `kind:` (nvidia-ctk writes it unindented, quoted or not); only the kind
# is read, so no YAML parser is needed.
_YAML_KIND = re.compile(r"""^kind:\s*["']?([^"'\s#]+)""", re.MULTILINE)


def _kind(path: Path) -> str:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
        except ValueError:
            return ""
        return str(doc.get("kind", "")) if isinstance(doc, dict) else ""
    match = _YAML_KIND.search(text)
    return match[1] if match else ""


def toolkit_specs(directories: Iterable[Path]) -> list[Path]:
    """The CDI specs of the NVIDIA Container Toolkit found in `directories`."""
    found = []
    for directory in directories:
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            continue
        found += [p for p in entries if p.suffix in (".json", ".yaml", ".yml")
                  and _kind(p) == TOOLKIT_KIND]
    return found


def check(driver: str, cdi_dir: Path, static_dir: Path = STATIC_CDI_DIR) -> dict[str, Any]:
    """The probe's `container_runtime` section for DRA mode."""
    if driver != "nvml":
        return {"needed": False, "found": [], "advice": ""}
    found = toolkit_specs([cdi_dir, static_dir])
    advice = "" if found else (
        f"no CDI spec of the NVIDIA Container Toolkit (kind {TOOLKIT_KIND}) in {cdi_dir} or "
        f"{static_dir}: a DRA workload gets the partition's device nodes and "
        "NVIDIA_VISIBLE_DEVICES only; give it runtimeClassName: nvidia, or run "
        "`nvidia-ctk cdi generate` on the node (docs/dra.md, Container runtime)")
    return {"needed": True, "found": [str(p) for p in found], "advice": advice}
