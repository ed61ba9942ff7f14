"""T-Head HGML (`libhgml.so`) as ctypes sees it: the structs and prototypes partkeeper uses.

HGML is NVML's shape under `hgml*` names: handles are one-pointer structs passed by value,
profile info is versioned (`version = sizeof | ver << 24`; v2 and v3 are both 152 bytes with
different fields from the third on). docs/drivers.md lists where each fact comes from.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, Structure, c_char, c_uint, c_ulonglong, c_void_p
from typing import Any

from partkeeper.drivers.clib import Api, Memory, Placement, declare, open_first

NAME_SIZE = 96  # HGML_DEVICE_NAME_V2_BUFFER_SIZE
UUID_SIZE = 96
PROFILE_PROBES = 85  # profile indices 0..84 are probed; the index is not the profile id
COMPUTE_PROFILE_PROBES = 28  # HGML_COMPUTE_INSTANCE_PROFILE_COUNT
CAPS_GFX = 0x2
MIG_ENABLE = 1
ENGINE_SHARED = 0
PPU_HOME = "/usr/local/PPU_SDK"  # the SDK's default home, where the library is looked for


class Handle(Structure):
    _fields_ = [("handle", c_void_p)]


_ENGINES = [
    (n, c_uint)
    for n in (
        "multiprocessorCount",
        "copyEngineCount",
        "decoderCount",
        "encoderCount",
        "jpegCount",
        "ofaCount",
    )
]


class ProfileInfoV2(Structure):
    _fields_ = [
        ("version", c_uint),
        ("id", c_uint),
        ("isP2pSupported", c_uint),
        ("sliceCount", c_uint),
        ("instanceCount", c_uint),
        *_ENGINES,
        ("memorySizeMB", c_ulonglong),
        ("name", c_char * NAME_SIZE),
    ]


class ProfileInfoV3(Structure):
    _fields_ = [
        ("version", c_uint),
        ("id", c_uint),
        ("sliceCount", c_uint),
        ("instanceCount", c_uint),
        *_ENGINES,
        ("memorySizeMB", c_ulonglong),
        ("name", c_char * NAME_SIZE),
        ("capabilities", c_uint),
    ]


PROFILE_V2 = ctypes.sizeof(ProfileInfoV2) | 2 << 24  # 0x02000098
PROFILE_V3 = ctypes.sizeof(ProfileInfoV3) | 3 << 24  # 0x03000098


class GpuInstanceInfo(Structure):
    _fields_ = [("device", Handle), ("id", c_uint), ("profileId", c_uint), ("placement", Placement)]


class ComputeProfileInfo(Structure):
    _fields_ = [
        (n, c_uint)
        for n in (
            "id",
            "sliceCount",
            "instanceCount",
            "multiprocessorCount",
            "sharedCopyEngineCount",
            "sharedDecoderCount",
            "sharedEncoderCount",
            "sharedJpegCount",
            "sharedOfaCount",
        )
    ]


class ComputeInstanceInfo(Structure):
    _fields_ = [
        ("device", Handle),
        ("gpuInstance", Handle),
        ("id", c_uint),
        ("profileId", c_uint),
        ("placement", Placement),
    ]


class ProcessInfo(Structure):
    _fields_ = [
        ("pid", c_uint),
        ("usedGpuMemory", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]


def candidates(env: dict[str, str] | None = None) -> list[str]:
    """Where libhgml.so is looked for: the loader's path, then `$PPU_HOME/lib64`, `$PPU_HOME/lib`
    (`PPU_HOME` defaults to /usr/local/PPU_SDK)."""
    env = dict(os.environ) if env is None else env
    home = env.get("PPU_HOME") or PPU_HOME
    return ["libhgml.so", f"{home}/lib64/libhgml.so", f"{home}/lib/libhgml.so"]


_P = POINTER


def _signatures() -> dict[str, tuple[Any, ...]]:
    H, u = Handle, c_uint
    return {
        "hgmlShutdown": (),
        "DeviceGetCount": (_P(u),),
        "DeviceGetHandleByIndex": (u, _P(H)),
        "hgmlDeviceGetName": (H, ctypes.c_char_p, u),
        "hgmlDeviceGetUUID": (H, ctypes.c_char_p, u),
        "hgmlDeviceGetMinorNumber": (H, _P(u)),
        "hgmlDeviceGetMemoryInfo": (H, _P(Memory)),
        "hgmlDeviceGetMigMode": (H, _P(u), _P(u)),
        "hgmlDeviceGetGpuInstanceProfileInfoV": (H, u, c_void_p),
        "hgmlDeviceGetGpuInstancePossiblePlacements_v2": (H, u, _P(Placement), _P(u)),
        "hgmlDeviceCreateGpuInstanceWithPlacement": (H, u, _P(Placement), _P(H)),
        "hgmlGpuInstanceDestroy": (H,),
        "hgmlDeviceGetGpuInstances": (H, u, _P(H), _P(u)),
        "hgmlDeviceGetGpuInstanceById": (H, u, _P(H)),
        "hgmlGpuInstanceGetInfo": (H, _P(GpuInstanceInfo)),
        "hgmlGpuInstanceGetComputeInstanceProfileInfo": (H, u, u, _P(ComputeProfileInfo)),
        "hgmlGpuInstanceCreateComputeInstance": (H, u, _P(H)),
        "hgmlGpuInstanceGetComputeInstanceById": (H, u, _P(H)),
        "ComputeInstanceGetInfo": (H, _P(ComputeInstanceInfo)),
        "hgmlComputeInstanceDestroy": (H,),
        "hgmlDeviceGetMaxMigDeviceCount": (H, _P(u)),
        "hgmlDeviceGetMigDeviceHandleByIndex": (H, u, _P(H)),
        "hgmlDeviceGetGpuInstanceId": (H, _P(u)),
        "hgmlDeviceGetComputeInstanceId": (H, _P(u)),
        "hgmlDeviceGetComputeRunningProcesses": (H, _P(u), _P(ProcessInfo)),
    }


# Entry points with versioned names: the first one the library exports is used.
_VERSIONED = {
    "Init": ("hgmlInit_v2", "hgmlInit"),
    "DeviceGetCount": ("hgmlDeviceGetCount_v2", "hgmlDeviceGetCount"),
    "DeviceGetHandleByIndex": ("hgmlDeviceGetHandleByIndex_v2", "hgmlDeviceGetHandleByIndex"),
    "ComputeInstanceGetInfo": ("hgmlComputeInstanceGetInfo_v2", "hgmlComputeInstanceGetInfo"),
}


def load(paths: list[str] | None = None) -> Api:
    """Open libhgml.so and declare every function; LibraryMissing (no library, or one lacking a
    versioned entry point, named), AttributeError (a plain symbol missing)."""
    return declare(open_first(paths or candidates()), {"Init": (), **_signatures()}, _VERSIONED)
