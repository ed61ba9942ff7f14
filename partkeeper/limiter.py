"""Who enforces logical slices (`PK_SLICE_LIMITER`): the names, the files, the container edits.

A logical slice is a share of a whole card; nothing in the hardware holds a container to it. With
`none` the slices are still handed out, and reported as unenforced wherever a person looks
(`partkeeper status`, the Allocate log line, the capacity document, the demo's summary). With
`hami-core`, HAMi-core's `libvgpu.so` is preloaded into the container and limits its device memory
and compute. The names below are HAMi's, so a node already set up for HAMi works unchanged:

- HAMi-core's README (Project-HAMi/HAMi-core, "Usage"): `CUDA_DEVICE_MEMORY_LIMIT` is the upper
  limit of device memory ("1g, 1024m, 1048576k, 1073741824"), `CUDA_DEVICE_SM_LIMIT` the SM
  utilisation percentage of each device, and `/tmp/vgpulock/` must exist (its cross-process lock
  directory).
- HAMi's device plugin (Project-HAMi/HAMi, pkg/device-plugin/nvidiadevice/nvinternal/plugin,
  `Allocate` in server.go, `GetLibPath` in util.go): per device `CUDA_DEVICE_MEMORY_LIMIT_<i>` =
  `<MiB>m` (i = the device's position in the container), `CUDA_DEVICE_SM_LIMIT` = the percentage,
  `CUDA_DEVICE_MEMORY_SHARED_CACHE` = a `.cache` file in a per-container directory the plugin
  makes and mounts read-write; read-only mounts of `$HOOK_PATH/vgpu/libvgpu.so` (from the host's
  library) and `/etc/ld.so.preload` (from the host's `$HOOK_PATH/vgpu/ld.so.preload`, which
  names the library's container path), and `/tmp/vgpulock` read-write from the host's (created
  mode 0777 so non-root containers can lock, HAMi's v2.2.9 fix). The chart's `HOOK_PATH` is
  `/usr/local`, so the library sits at `/usr/local/vgpu/libvgpu.so` in the container.

Ours differ in one place: the cache file lives in the Pod's working directory
(`PK_PODS_DIR/<podUID>/c-<container>/sliced/cache/`, made by the allocator, collected by the GC
with the slice), not in HAMi's `$HOOK_PATH/vgpu/containers/`. Its name is fixed, so a retried
Allocate returns the same reply.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from partkeeper.config import Config
from partkeeper.drivers.base import ContainerEdits, HostMount
from partkeeper.errors import StartupError

NONE = "none"
HAMI_CORE = "hami-core"

LIBRARY = "libvgpu.so"
PRELOAD = "ld.so.preload"
CONTAINER_LIBRARY = "/usr/local/vgpu/libvgpu.so"  # what HAMi's ld.so.preload names
CONTAINER_PRELOAD = "/etc/ld.so.preload"
LOCK_DIR = "/tmp/vgpulock"  # HAMi-core's lock directory, the same path on the host
CACHE_FILE = "vgpu.cache"

ENV_MEMORY = "CUDA_DEVICE_MEMORY_LIMIT"  # per device: CUDA_DEVICE_MEMORY_LIMIT_<i>
ENV_SM = "CUDA_DEVICE_SM_LIMIT"
ENV_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"


@dataclass(frozen=True, slots=True)
class LimiterState:
    """What `status`, `probe` and the allocator's capacity document say about enforcement."""

    name: str  # "none" or "hami-core"
    enforced: bool  # a limiter is configured and its files are present
    dir: str = ""  # the host dir of its files ("" for none)
    missing: tuple[str, ...] = ()  # files of the limiter that are not there

    def sentence(self) -> str:
        if self.name == NONE:
            return ("logical slices are NOT enforced (PK_SLICE_LIMITER=none): a container can use "
                    "the whole card")
        if self.missing:
            return (f"logical slices are NOT enforced: {self.name} is configured but "
                    f"{', '.join(self.missing)} is missing")
        return f"logical slices are enforced by {self.name} (files in {self.dir})"


def required(directory: Path) -> tuple[Path, ...]:
    """The host files a `hami-core` reply mounts."""
    return (directory / LIBRARY, directory / PRELOAD)


def _missing(directory: Path) -> tuple[str, ...]:
    gone = []
    for path in required(directory):
        try:
            ok = stat.S_ISREG(os.stat(path).st_mode)
        except OSError:
            ok = False
        if not ok:
            gone.append(str(path))
    return tuple(gone)


def state(config: Config) -> LimiterState:
    """The limiter as configured, with its files looked at now (blocking: a few stats)."""
    if config.slice_limiter == NONE:
        return LimiterState(NONE, enforced=False)
    missing = _missing(config.slice_limiter_dir)
    return LimiterState(config.slice_limiter, enforced=not missing,
                        dir=str(config.slice_limiter_dir), missing=missing)


def report(config: Config) -> dict[str, object]:
    """What `partkeeper probe` shows: the limiter, whether each of its files is present, and a
    sentence."""
    found = state(config)
    files = {str(p): str(p) not in found.missing for p in required(config.slice_limiter_dir)}
    return {"name": found.name, "enforced": found.enforced, "dir": found.dir,
            "files": files if found.name != NONE else {}, "line": found.sentence()}


def check(config: Config) -> LimiterState:
    """The state at start; a configured limiter whose files are missing stops the start."""
    found = state(config)
    if found.missing:
        raise StartupError(
            f"PK_SLICE_LIMITER={found.name} needs {' and '.join(found.missing)} (regular files; "
            "PK_SLICE_LIMITER_DIR must be the host dir of HAMi-core's library, mounted at the "
            "same path), so the allocator does not start rather than hand out unenforced slices"
        )
    return found


def ensure_lock_dir(path: Path) -> None:
    """HAMi-core's lock directory, world-writable and sticky as HAMi's device plugin makes it.
    Raises StartupError with one sentence when it cannot be made."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o1777)
    except OSError as exc:
        raise StartupError(f"cannot make HAMi-core's lock directory {path}: "
                           f"{exc.strerror or exc}") from exc


def hami_edits(
    memory_mib: Sequence[int], compute_percent: int, directory: Path, cache_dir: str,
    host_lock_dir: str = LOCK_DIR,
) -> ContainerEdits:
    """HAMi-core's env and mounts for a container whose device `i` may use `memory_mib[i]` MiB
    and `compute_percent` of its SMs; `cache_dir` is the container path of the slice's cache
    directory (mounted read-write by the reply). Pure."""
    env = {f"{ENV_MEMORY}_{i}": f"{mib}m" for i, mib in enumerate(memory_mib)}
    env[ENV_SM] = str(compute_percent)
    env[ENV_CACHE] = f"{cache_dir}/{CACHE_FILE}"
    mounts = (
        HostMount(CONTAINER_LIBRARY, str(directory / LIBRARY), read_only=True),
        HostMount(CONTAINER_PRELOAD, str(directory / PRELOAD), read_only=True),
        HostMount(LOCK_DIR, host_lock_dir, read_only=False),
    )
    return ContainerEdits(env=env, mounts=mounts)
