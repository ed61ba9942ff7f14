"""The container runtime's check of the device specs an Allocate reply hands a container.

kubelet passes each `DeviceSpec` to the runtime in the container's CRI config, and containerd
turns it into an OCI device from its host path before anything runs: `WithDevices`
(internal/cri/opts/spec_linux_opts.go) resolves the host path's symlinks
(`osi.ResolveSymbolicLink`), then `DeviceFromPath` (pkg/oci/utils_unix.go) lstat-s it and takes only
a block, character or FIFO device (`ErrNotADevice`, "not a device node", for anything else). Any
error fails CreateContainer; kubelet reports it as the container's `CreateContainerError` and the
Pod stays Pending with its devices. runc's libcontainer/devices `DeviceFromPath` (cri-o) does the
same. The NVIDIA toolkit's hook runs later, inside the started container's creation, so it cannot
make a node the spec already named.

CDI devices are not checked here: the runtime reads their nodes from the spec, and a node with its
type, major and minor needs no host node (docs/drivers.md, "Device handoff and CDI").
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from partkeeper.kubelet import deviceplugin_pb2

_DEVICES = (stat.S_IFBLK, stat.S_IFCHR, stat.S_IFIFO)


def device_error(host_path: str) -> str | None:
    """Why the runtime cannot make a device of `host_path`, in containerd's words (None: it
    can)."""
    try:
        resolved = os.path.realpath(host_path, strict=True)
        mode = os.lstat(resolved).st_mode
    except OSError as exc:
        return f"lstat {host_path}: {(exc.strerror or str(exc)).lower()}"
    if stat.S_IFMT(mode) not in _DEVICES:
        return f"{host_path}: not a device node"
    return None


def create_error(responses: Iterable[deviceplugin_pb2.ContainerAllocateResponse]) -> str | None:
    """The CreateContainer error of a container given these replies (the first bad device spec),
    or None when every host path is a device node."""
    for response in responses:
        for spec in response.devices:
            problem = device_error(spec.host_path)
            if problem is not None:
                return (f"failed to generate container spec: device {spec.container_path}: "
                        f"{problem}")
    return None
