"""A small in-memory model of NVML on MIG GPUs: just the calls the nvml driver makes.

Installed as `pynvml` (monkeypatching sys.modules). It models what the driver relies on: GPU
instance profiles with NVML ids, including the +me variants the driver must never pick; placements
in eight memory slices with NVML's refusals (illegal placement, occupied slices); lowest-free GI
ids; compute instances and the MIG devices they appear as, by index; name-based MIG UUIDs; in-use
refusals while processes run or CIs remain; and injectable errors per function.
"""

from __future__ import annotations

import ctypes
import functools
import types
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_NS = uuid.UUID("0b5c1f0e-7f3a-4c1e-9d55-3a7e6f2c8b11")
_ONE, _EVEN4, _EVEN3 = (0, 1, 2, 3, 4, 5, 6), (0, 2, 4, 6), (0, 2, 4)


@dataclass(frozen=True)
class Row:
    const: int  # NVML_GPU_INSTANCE_PROFILE_* the driver asks about
    nvml_id: int  # the profile id NVML reports and takes
    name: str
    compute: int  # compute slices (NVML's sliceCount)
    size: int  # memory slices of a placement
    starts: tuple[int, ...]
    memory_mb: int


def _rows(names: str, mb: list[int]) -> list[Row]:
    """A model's GI profiles, named in this order: 1g, 1g+me, 1g on two slices, 2g, 3g, 4g, 7g."""
    p1, p1me, p1x2, p2, p3, p4, p7 = names.split()
    return [
        Row(0x0, 19, p1, 1, 1, _ONE, mb[0]),
        Row(0x7, 20, p1me, 1, 1, _ONE, mb[0]),  # REV1: the +me variant
        Row(0x9, 15, p1x2, 1, 2, _EVEN4, mb[1]),  # REV2: one compute slice, two memory slices
        Row(0x1, 14, p2, 2, 2, _EVEN3, mb[1]),
        Row(0x2, 9, p3, 3, 4, (0, 4), mb[2]),
        Row(0x3, 5, p4, 4, 4, (0,), mb[2]),
        Row(0x4, 0, p7, 7, 8, (0,), mb[3]),
    ]


TABLES: dict[str, list[Row]] = {
    "A100-40GB": _rows(
        "1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb", [4864, 9856, 19968, 40192]
    ),
    "H100-80GB": _rows(
        "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb", [9856, 19968, 40448, 80896]
    ),
    "H200-141GB": _rows(
        "1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb",
        [16384, 32768, 71424, 143360],
    ),
}
_CI_SLICES = {0x0: 1, 0x1: 2, 0x2: 3, 0x3: 4, 0x4: 7}


@dataclass
class Ci:
    ci_id: int
    uuid: str
    compute: int
    processes: int = 0


@dataclass
class Gi:
    gi_id: int
    row: Row
    start: int
    handle: int
    cis: dict[int, Ci] = field(default_factory=dict)


@dataclass
class FakeGpu:
    name: str  # what nvmlDeviceGetName says, e.g. "NVIDIA H100 80GB HBM3"
    memory_mib: int
    table: str | None  # key of TABLES; None: the card has no MIG at all
    mig: bool = True
    uuid: str = ""
    gis: dict[int, Gi] = field(default_factory=dict)


@dataclass(frozen=True)
class MigDevice:
    gpu: FakeGpu
    gi: Gi
    ci: Ci


@dataclass(frozen=True)
class CiHandle:
    gi: Gi
    ci: Ci


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_NAMES.get(self.value, f"NVML error {self.value}")


_ERROR_NAMES = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    6: "Not Found",
    7: "Insufficient Size",
    19: "In use by another client",
    23: "Insufficient Resources",
    999: "Unknown Error",
}


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


def _nvml(fn: F) -> F:
    """Every fake NVML call: refuses before nvmlInit and honours injected failures."""

    @functools.wraps(fn)
    def call(self: FakeNvml, *args: Any) -> Any:
        if fn.__name__ != "nvmlInit" and not self.initialised:
            raise NVMLError(self.NVML_ERROR_UNINITIALIZED)
        pending = self.failures.get(fn.__name__)
        if pending:
            code = pending.pop(0)
            raise NVMLError(code)
        self.calls.append(fn.__name__)
        return fn(self, *args)

    return call  # type: ignore[return-value]


class FakeNvml(types.ModuleType):
    """The fake `pynvml` module: NVML constants, types and functions over in-memory GPUs."""

    NVML_SUCCESS = 0
    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_INSUFFICIENT_SIZE = 7
    NVML_ERROR_IN_USE = 19
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23
    NVML_ERROR_UNKNOWN = 999
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
    NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
    NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
    NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
    NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
    NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
    NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
    NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
    NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0
    MAX_MIG_DEVICES = 7

    NVMLError = NVMLError
    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = ctypes.c_void_p  # GI handles are small positive integers here

    def __init__(self, gpus: list[FakeGpu], *, profile_names: bool = True) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.profile_names = profile_names  # False: NVML gives no names, match by slices+memory
        self.initialised = False
        self.failures: dict[str, list[int]] = {}
        self.calls: list[str] = []
        self._handles: dict[int, tuple[FakeGpu, Gi]] = {}
        self._next_handle = 1
        for index, gpu in enumerate(gpus):
            gpu.uuid = gpu.uuid or f"GPU-{uuid.uuid5(_NS, f'{index}/{gpu.name}')}"

    # -- test controls ------------------------------------------------------------------------

    def fail(self, function: str, code: int, times: int = 1) -> None:
        """The next `times` calls of `function` raise NVMLError(code)."""
        self.failures.setdefault(function, []).extend([code] * times)

    def set_processes(self, mig_uuid: str, count: int) -> None:
        for gpu in self.gpus:
            for gi in gpu.gis.values():
                for ci in gi.cis.values():
                    if ci.uuid == mig_uuid:
                        ci.processes = count
                        return
        raise KeyError(mig_uuid)

    def add_gi(self, card: int, name: str, start: int, with_ci: bool = True) -> Gi:
        """Carve by hand (any profile, +me included), as an operator with nvidia-smi would."""
        gpu = self.gpus[card]
        row = next(r for r in TABLES[gpu.table or ""] if r.name == name)
        placement = c_nvmlGpuInstancePlacement_t(start, row.size)
        gi = self._gi(self.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, row.nvml_id, placement))
        if with_ci:
            shared = self.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            info = self.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi.handle, _ci_const(row.compute), shared
            )
            self.nvmlGpuInstanceCreateComputeInstance(gi.handle, info.id)
        return gi

    # -- helpers ------------------------------------------------------------------------------

    def _gi(self, handle: int) -> Gi:
        if handle not in self._handles:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[handle][1]

    def _row(self, gpu: FakeGpu, nvml_id: int) -> Row:
        for row in TABLES.get(gpu.table or "", []):
            if row.nvml_id == nvml_id:
                return row
        raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)

    def _mig_devices(self, gpu: FakeGpu) -> list[MigDevice]:
        return [
            MigDevice(gpu, gi, ci)
            for gi in sorted(gpu.gis.values(), key=lambda g: g.gi_id)
            for ci in sorted(gi.cis.values(), key=lambda c: c.ci_id)
        ]

    # -- NVML ---------------------------------------------------------------------------------

    @_nvml
    def nvmlInit(self) -> None:
        self.initialised = True

    @_nvml
    def nvmlShutdown(self) -> None:
        self.initialised = False

    @_nvml
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    @_nvml
    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    @_nvml
    def nvmlDeviceGetName(self, dev: FakeGpu) -> str:
        return dev.name

    @_nvml
    def nvmlDeviceGetUUID(self, dev: FakeGpu | MigDevice) -> str:
        if isinstance(dev, MigDevice):
            if dev.gi.cis.get(dev.ci.ci_id) is not dev.ci:
                raise NVMLError(self.NVML_ERROR_NOT_FOUND)
            return dev.ci.uuid
        return dev.uuid

    @_nvml
    def nvmlDeviceGetMemoryInfo(self, dev: FakeGpu) -> types.SimpleNamespace:
        total = dev.memory_mib * 2**20
        return types.SimpleNamespace(total=total, free=total, used=0)

    @_nvml
    def nvmlDeviceGetMigMode(self, dev: FakeGpu) -> list[int]:
        if dev.table is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        mode = self.NVML_DEVICE_MIG_ENABLE if dev.mig else self.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    @_nvml
    def nvmlDeviceGetGpuInstanceProfileInfo(self, dev: FakeGpu, const: int) -> Any:
        if not 0 <= const < self.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        for row in TABLES.get(dev.table or "", []):
            if row.const == const:
                name = f"MIG {row.name}".encode() if self.profile_names else b""
                return types.SimpleNamespace(
                    id=row.nvml_id,
                    sliceCount=row.compute,
                    instanceCount=len(row.starts),
                    memorySizeMB=row.memory_mb,
                    name=name,
                )
        raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    @_nvml
    def nvmlDeviceGetGpuInstances(self, dev: FakeGpu, nvml_id: int, array: Any, count: Any) -> int:
        self._row(dev, nvml_id)
        found = sorted(
            (gi for gi in dev.gis.values() if gi.row.nvml_id == nvml_id), key=lambda g: g.gi_id
        )
        if len(found) > len(array):
            raise NVMLError(self.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, gi in enumerate(found):
            array[i] = gi.handle
        count.contents.value = len(found)
        return self.NVML_SUCCESS

    @_nvml
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, dev: FakeGpu, nvml_id: int, placement: c_nvmlGpuInstancePlacement_t
    ) -> int:
        if not dev.mig:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        row = self._row(dev, nvml_id)
        if placement.start not in row.starts or placement.size != row.size:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        for gi in dev.gis.values():
            lo, hi = gi.start, gi.start + gi.row.size
            if placement.start < hi and lo < placement.start + placement.size:
                raise NVMLError(self.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = next(i for i in range(1, 64) if i not in dev.gis)
        handle, self._next_handle = self._next_handle, self._next_handle + 1
        gi = Gi(gi_id, row, placement.start, handle)
        dev.gis[gi_id] = gi
        self._handles[handle] = (dev, gi)
        return handle

    @_nvml
    def nvmlGpuInstanceGetInfo(self, handle: int) -> Any:
        gpu, gi = self._handles.get(handle, (None, None))
        if gi is None:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        placement = types.SimpleNamespace(start=gi.start, size=gi.row.size)
        return types.SimpleNamespace(
            device=gpu, id=gi.gi_id, profileId=gi.row.nvml_id, placement=placement
        )

    @_nvml
    def nvmlDeviceGetGpuInstanceById(self, dev: FakeGpu, gi_id: int) -> int:
        if gi_id not in dev.gis:
            raise NVMLError(self.NVML_ERROR_NOT_FOUND)
        return dev.gis[gi_id].handle

    @_nvml
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, handle: int, const: int, engine: int
    ) -> Any:
        gi = self._gi(handle)
        slices = _CI_SLICES.get(const)
        if slices is None or slices > gi.row.compute:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(id=100 + const, sliceCount=slices, instanceCount=1)

    @_nvml
    def nvmlGpuInstanceCreateComputeInstance(self, handle: int, ci_profile_id: int) -> CiHandle:
        gi = self._gi(handle)
        dev = self._handles[handle][0]
        slices = _CI_SLICES.get(ci_profile_id - 100)
        if slices is None or slices > gi.row.compute:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        if sum(ci.compute for ci in gi.cis.values()) + slices > gi.row.compute:
            raise NVMLError(self.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in range(64) if i not in gi.cis)
        name = f"{dev.uuid}/{gi.gi_id}/{ci_id}/{gi.row.name}/{gi.start}"
        ci = Ci(ci_id, f"MIG-{uuid.uuid5(_NS, name)}", slices)
        gi.cis[ci_id] = ci
        return CiHandle(gi, ci)

    @_nvml
    def nvmlComputeInstanceGetInfo(self, ci: CiHandle) -> Any:
        return types.SimpleNamespace(id=ci.ci.ci_id)

    @_nvml
    def nvmlGpuInstanceGetComputeInstanceById(self, handle: int, ci_id: int) -> CiHandle:
        gi = self._gi(handle)
        if ci_id not in gi.cis:
            raise NVMLError(self.NVML_ERROR_NOT_FOUND)
        return CiHandle(gi, gi.cis[ci_id])

    @_nvml
    def nvmlComputeInstanceDestroy(self, ci: CiHandle) -> int:
        if ci.gi.cis.get(ci.ci.ci_id) is not ci.ci:
            raise NVMLError(self.NVML_ERROR_NOT_FOUND)
        if ci.ci.processes:
            raise NVMLError(self.NVML_ERROR_IN_USE)
        del ci.gi.cis[ci.ci.ci_id]
        return self.NVML_SUCCESS

    @_nvml
    def nvmlGpuInstanceDestroy(self, handle: int) -> int:
        gpu, gi = self._handles.get(handle, (None, None))
        if gpu is None or gi is None:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        if gi.cis:
            raise NVMLError(self.NVML_ERROR_IN_USE)  # NVML refuses while compute instances exist
        del gpu.gis[gi.gi_id]
        del self._handles[handle]
        return self.NVML_SUCCESS

    @_nvml
    def nvmlDeviceGetMaxMigDeviceCount(self, dev: FakeGpu) -> int:
        return self.MAX_MIG_DEVICES if dev.mig else 0

    @_nvml
    def nvmlDeviceGetMigDeviceHandleByIndex(self, dev: FakeGpu, index: int) -> MigDevice:
        if not 0 <= index < self.MAX_MIG_DEVICES:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        devices = self._mig_devices(dev)
        if index >= len(devices):
            raise NVMLError(self.NVML_ERROR_NOT_FOUND)
        return devices[index]

    @_nvml
    def nvmlDeviceGetGpuInstanceId(self, mig: MigDevice) -> int:
        return mig.gi.gi_id

    @_nvml
    def nvmlDeviceGetComputeInstanceId(self, mig: MigDevice) -> int:
        return mig.ci.ci_id

    @_nvml
    def nvmlDeviceGetComputeRunningProcesses(self, mig: MigDevice) -> list[Any]:
        return [types.SimpleNamespace(pid=1000 + n) for n in range(mig.ci.processes)]


def _ci_const(compute: int) -> int:
    return next(const for const, slices in _CI_SLICES.items() if slices == compute)


def standard_gpus() -> list[FakeGpu]:
    """The node the contract suite runs on: one of each model in MIG mode, and one sliced card."""
    return [
        FakeGpu("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        FakeGpu("NVIDIA A100-SXM4-40GB", 40536, "A100-40GB"),
        FakeGpu("NVIDIA H200", 143771, "H200-141GB"),
        FakeGpu("NVIDIA A100-PCIE-40GB", 40536, "A100-40GB", mig=False),
    ]
