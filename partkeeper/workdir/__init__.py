"""Path-safety primitives for PK_PODS_DIR, shared by the allocator, the reclaimer and the GC.

Layout: `<root>/<podUID>/c-<container>/partition-<MIG uuid>.json` (a partition descriptor) and
`<root>/<podUID>/c-<container>/sliced/` (a logical slice's files, a cache dir and the ownership
mark `.partkeeper-owned`). Every name is validated before a path is built from it; below the root
everything is reached through directory fds that never follow a symlink and never cross into
another filesystem. Failures raise `WorkdirError` (or its `InvalidName` / `UnsafePath`) naming
the path and the reason. All calls are blocking: from asyncio, call them via `asyncio.to_thread`.
"""

from partkeeper.workdir.cache import ScanCache
from partkeeper.workdir.fd import DeviceOf, st_device
from partkeeper.workdir.names import (
    CONTAINER_PREFIX,
    DIR_MODE,
    FILE_MODE,
    MARK,
    MARK_OWNER,
    SLICED,
    InvalidName,
    UnsafePath,
    WorkdirError,
    container_dir,
    container_of,
    descriptor_entry,
    descriptor_path,
    is_descriptor_entry,
    mark_body,
    pod_dir,
    sliced_dir,
)
from partkeeper.workdir.purge import Purge, collect_sliced, remove_empty
from partkeeper.workdir.scan import (
    ContainerListing,
    Entry,
    PodListing,
    RootScan,
    scan_pod,
    scan_root,
)
from partkeeper.workdir.write import remove_descriptor, write_descriptor, write_sliced

__all__ = [
    "CONTAINER_PREFIX",
    "DIR_MODE",
    "FILE_MODE",
    "MARK",
    "MARK_OWNER",
    "SLICED",
    "ContainerListing",
    "DeviceOf",
    "Entry",
    "InvalidName",
    "PodListing",
    "Purge",
    "RootScan",
    "ScanCache",
    "UnsafePath",
    "WorkdirError",
    "collect_sliced",
    "container_dir",
    "container_of",
    "descriptor_entry",
    "descriptor_path",
    "is_descriptor_entry",
    "mark_body",
    "pod_dir",
    "remove_descriptor",
    "remove_empty",
    "scan_pod",
    "scan_root",
    "sliced_dir",
    "st_device",
    "write_descriptor",
    "write_sliced",
]
