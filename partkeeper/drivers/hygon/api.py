"""Hygon DMI (`libhydmi_mig.so.1`) as ctypes sees it: the structs and prototypes partkeeper uses.

The library exports NVML's own symbol names with Hygon's structs and plain-pointer handles. So it
is opened RTLD_LOCAL and every function is resolved from that handle (`Library.function` is
`dlsym(handle, name)`): in a process that also holds libnvidia-ml (pynvml), a global lookup would
bind these names to NVIDIA's functions, with structs that do not agree. No init call exists.
"""

from __future__ import annotations

from ctypes import POINTER, Structure, c_char, c_char_p, c_uint, c_ulonglong, c_void_p
from typing import Any

from partkeeper.drivers.clib import Api, Memory, Placement, declare, open_first

NAME_SIZE = 256
SLICE_WIDTHS = (1, 2, 3, 4)  # profile queries take a slice count minus one, not an id
MAX_INSTANCES = 32  # the buffer for placements and instance lists (count in/out)
MIG_ENABLE = 1
ENGINE_SHARED = 0
SEARCH_DIRS = ("/opt/hyhal/lib", "/opt/dtk/lib")


class GpuInstanceProfileInfo(Structure):
    _fields_ = [
        ("id", c_uint),
        ("gi_count_max", c_uint),
        ("cu_count", c_uint),
        ("gpu_slice_count", c_uint),
        ("memory_size_MB", c_ulonglong),
        ("name", c_char * NAME_SIZE),
    ]


class ComputeInstanceProfileInfo(Structure):
    _fields_ = [
        ("id", c_uint),
        ("ci_count_max", c_uint),
        ("cu_count", c_uint),
        ("gpu_slice_count", c_uint),
        ("name", c_char * NAME_SIZE),
    ]


class GpuInstanceInfo(Structure):
    _fields_ = [
        ("device", c_void_p),
        ("id", c_uint),
        ("profile_id", c_uint),
        ("placement", Placement),
    ]


class ComputeInstanceInfo(Structure):
    _fields_ = [
        ("device", c_void_p),
        ("gpu_instance", c_void_p),
        ("id", c_uint),
        ("profile_id", c_uint),
        ("placement", Placement),
    ]


def candidates() -> list[str]:
    """The versioned soname first (a host can carry it without the bare one), then the hyhal and
    dtk trees, which are not on the loader's path."""
    names = ("libhydmi_mig.so.1", "libhydmi_mig.so")
    return [*names, *(f"{d}/{n}" for d in SEARCH_DIRS for n in names)]


def _signatures() -> dict[str, tuple[Any, ...]]:
    P, u, h = POINTER, c_uint, c_void_p
    return {
        "nvmlGetSystemMigMode": (P(u), P(u)),
        "nvmlDeviceGetCount": (P(u),),
        "nvmlDeviceGetHandleByPciBusId": (c_char_p, P(h)),
        "nvmlDeviceGetIndex": (h, P(u)),
        "nvmlDeviceGetMemoryInfo": (h, P(Memory)),
        "nvmlDeviceGetGpuInstanceProfileInfo": (h, u, P(GpuInstanceProfileInfo)),
        "nvmlDeviceGetGpuInstancePossiblePlacements": (h, u, P(Placement), P(u)),
        "nvmlDeviceGetGpuInstances": (h, u, P(h), P(u)),
        "nvmlDeviceCreateGpuInstanceWithPlacement": (h, u, P(Placement), P(h)),
        "nvmlGpuInstanceGetInfo": (h, P(GpuInstanceInfo)),
        "nvmlGpuInstanceDestroy": (h,),
        "nvmlGpuInstanceGetComputeInstanceProfileInfo": (h, u, u, P(ComputeInstanceProfileInfo)),
        "nvmlGpuInstanceGetComputeInstances": (h, u, P(h), P(u)),
        "nvmlGpuInstanceCreateComputeInstance": (h, u, P(h)),
        "nvmlComputeInstanceGetInfo": (h, P(ComputeInstanceInfo)),
        "nvmlComputeInstanceDestroy": (h,),
    }


def load(paths: list[str] | None = None) -> Api:
    """Open the library RTLD_LOCAL and declare every function from its own handle."""
    return declare(open_first(paths or candidates(), local=True), _signatures())
