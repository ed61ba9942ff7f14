"""The `nvml` driver: MIG partitions through NVIDIA's management library (nvidia-ml-py).

`pynvml` is imported when the driver is opened, not when this module is imported, so partkeeper
(and the sim driver) work on machines with neither a GPU nor the library.

A partition is one GPU instance (GI) holding one full-size compute instance (CI); its identity is
the MIG device UUID NVML reports for that CI. Every enumeration fails closed: any NVML error while
reading is a ReadError, never an empty or shortened list.
"""

from __future__ import annotations

import ctypes
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from partkeeper.drivers import profiles
from partkeeper.drivers.base import (
    Card,
    DriverError,
    IdentityMismatchError,
    Instance,
    InstanceSpec,
    InUseError,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
)

T = TypeVar("T")
# The GI profiles partkeeper creates; the +me/+gfx/-me variants share slice counts and memory with
# these, so matching is restricted to this set. Enumeration still covers every profile.
_BASE_GI_PROFILES = ("1_SLICE", "1_SLICE_REV2", "2_SLICE", "3_SLICE", "4_SLICE", "7_SLICE")
_MEMORY_TOLERANCE = 0.25  # NVML reports usable memory, a little under the nominal size


def model_for(name: str, memory_mib: int) -> str | None:
    """The profiles.py model of a card NVML names `name` with `memory_mib` total, or None.

    The family comes from the name (whole word, so "GH200" is not an "H200"), the size from the
    memory, because one family ships in several sizes (A100 40GB and 80GB).
    """
    family = [
        m for m in profiles.MODELS.values() if re.search(rf"\b{m.name.split('-')[0]}\b", name)
    ]
    best = min(family, key=lambda m: abs(m.memory_mib - memory_mib), default=None)
    if best is None or abs(best.memory_mib - memory_mib) > 0.1 * best.memory_mib:
        return None
    return best.name


@dataclass(frozen=True, slots=True)
class _GiProfile:
    name: str  # ours for the base profiles ("1g.10gb"), NVML's for the others ("1g.10gb+me")
    nvml_id: int
    size: int  # memory slices of a placement; from the table for base profiles
    base: bool


@dataclass(frozen=True, slots=True)
class _Gi:
    handle: Any
    gi_id: int
    profile: str
    start: int
    size: int


class NvmlDriver:
    """The Driver protocol over NVML. Thread-safe as far as NVML is; holds no state but handles."""

    name = "nvml"

    def __init__(self) -> None:
        self._nv: ModuleType = importlib.import_module("pynvml")
        self._profiles: dict[int, dict[int, _GiProfile]] = {}  # per card, keyed by NVML id
        self._read("open", None, "initialising NVML", self._nv.nvmlInit)

    def close(self) -> None:
        self._read("close", None, "shutting NVML down", self._nv.nvmlShutdown)

    # -- NVML calls, errors mapped ------------------------------------------------------------

    def _code(self, exc: BaseException) -> int | None:
        return getattr(exc, "value", None) if isinstance(exc, self._nv.NVMLError) else None

    def _read(
        self, op: str, card: int | None, what: str, fn: Callable[..., T], *args: Any
    ) -> T:
        """An NVML read: any failure is a ReadError, never "absent"."""
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            raise ReadError(op, card, None, f"{what}: {exc}") from exc

    def _act(
        self, op: str, card: int, instance: str | None, what: str, fn: Callable[..., T], *args: Any
    ) -> T:
        """An NVML change: in-use and not-found keep their meaning, the rest is unknown."""
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            code = self._code(exc)
            kind: type[DriverError] = UnknownError
            if code == self._nv.NVML_ERROR_IN_USE:
                kind = InUseError
            elif code == self._nv.NVML_ERROR_NOT_FOUND:
                kind = NotFoundError
            elif code == self._nv.NVML_ERROR_INSUFFICIENT_RESOURCES and op == "create":
                kind = PlacementError
            raise kind(op, card, instance, f"{what}: {exc}") from exc

    def _device(self, op: str, card: int) -> Any:
        return self._read(op, card, "getting the device handle", self._nv.nvmlDeviceGetHandleByIndex, card)

    def _mig_enabled(self, op: str, card: int, dev: Any) -> bool:
        try:
            current = self._nv.nvmlDeviceGetMigMode(dev)[0]
        except self._nv.NVMLError as exc:
            if self._code(exc) == self._nv.NVML_ERROR_NOT_SUPPORTED:
                return False  # a card without MIG at all: sliced
            raise ReadError(op, card, None, f"reading the MIG mode: {exc}") from exc
        return bool(current == self._nv.NVML_DEVICE_MIG_ENABLE)

    # -- profiles -----------------------------------------------------------------------------

    def _gi_profiles(self, op: str, card: int, dev: Any) -> dict[int, _GiProfile]:
        """Every GI profile the card supports, keyed by NVML profile id; cached, it is static."""
        if card in self._profiles:
            return self._profiles[card]
        name = self._read(op, card, "reading the name", self._nv.nvmlDeviceGetName, dev)
        memory = self._read(op, card, "reading the memory", self._nv.nvmlDeviceGetMemoryInfo, dev)
        model_name = model_for(name, memory.total // 2**20)
        table = profiles.MODELS[model_name].profiles if model_name else {}
        base = {getattr(self._nv, f"NVML_GPU_INSTANCE_PROFILE_{b}") for b in _BASE_GI_PROFILES}
        found: dict[int, _GiProfile] = {}
        claimed: set[str] = set()
        for const in range(self._nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = self._profile_info(op, card, dev, const)
            if info is None:
                continue
            ours = _match(table, info, claimed) if const in base else None
            if ours is not None:
                claimed.add(ours.name)
                found[info.id] = _GiProfile(ours.name, info.id, ours.size, True)
            else:
                nvml_name = _nvml_name(info) or f"nvml-profile-{info.id}"
                found[info.id] = _GiProfile(nvml_name, info.id, 0, False)
        self._profiles[card] = found
        return found

    def _profile_info(self, op: str, card: int, dev: Any, const: int) -> Any | None:
        try:
            return self._nv.nvmlDeviceGetGpuInstanceProfileInfo(dev, const)
        except self._nv.NVMLError as exc:
            if self._code(exc) in (
                self._nv.NVML_ERROR_NOT_SUPPORTED,
                self._nv.NVML_ERROR_INVALID_ARGUMENT,
            ):
                return None  # this card does not offer that profile
            raise ReadError(op, card, None, f"reading GI profile {const}: {exc}") from exc

    # -- enumeration --------------------------------------------------------------------------

    def cards(self) -> list[Card]:
        count = self._read("list", None, "counting devices", self._nv.nvmlDeviceGetCount)
        return [self._card(index) for index in range(count)]

    def _card(self, index: int) -> Card:
        dev = self._device("list", index)
        name = self._read("list", index, "reading the name", self._nv.nvmlDeviceGetName, dev)
        uuid = self._read("list", index, "reading the UUID", self._nv.nvmlDeviceGetUUID, dev)
        memory = self._read("list", index, "reading the memory", self._nv.nvmlDeviceGetMemoryInfo, dev)
        memory_mib = int(memory.total // 2**20)
        mode = "partition" if self._mig_enabled("list", index, dev) else "sliced"
        # An unknown model keeps NVML's name: listed and counted, offered no profiles.
        model_name = model_for(name, memory_mib) or name
        return Card(index, uuid, model_name, mode, memory_mib)

    def _gpu_instances(self, op: str, card: int, dev: Any) -> list[_Gi]:
        found: list[_Gi] = []
        for prof in self._gi_profiles(op, card, dev).values():
            info = self._read(
                op, card, "reading GI profile", self._nv.nvmlDeviceGetGpuInstanceProfileInfo, dev,
                _const_for(self._nv, dev, prof.nvml_id),
            ) if False else None
            del info
            handles = self._gi_handles(op, card, dev, prof)
            for handle in handles:
                gi = self._read(op, card, "reading a GPU instance", self._nv.nvmlGpuInstanceGetInfo, handle)
                found.append(_Gi(handle, gi.id, prof.name, gi.placement.start, gi.placement.size))
        return sorted(found, key=lambda g: g.start)

    def _gi_handles(self, op: str, card: int, dev: Any, prof: _GiProfile) -> list[Any]:
        capacity = profiles.SLICES_PER_CARD  # no profile has more instances than memory slices
        array = (self._nv.c_nvmlGpuInstance_t * capacity)()
        count = ctypes.c_uint(0)
        what = f"listing {prof.name} GPU instances"
        self._read(op, card, what, self._nv.nvmlDeviceGetGpuInstances, dev, prof.nvml_id, array,
                   ctypes.pointer(count))
        return [array[i] for i in range(count.value)]

    def _mig_devices(self, op: str, card: int, dev: Any) -> dict[int, list[tuple[int, str, Any]]]:
        """MIG devices by GI id: (CI id, MIG UUID, handle), lowest CI first."""
        total = self._read(op, card, "counting MIG devices", self._nv.nvmlDeviceGetMaxMigDeviceCount, dev)
        found: dict[int, list[tuple[int, str, Any]]] = {}
        for index in range(total):
            try:
                mig = self._nv.nvmlDeviceGetMigDeviceHandleByIndex(dev, index)
            except self._nv.NVMLError as exc:
                if self._code(exc) == self._nv.NVML_ERROR_NOT_FOUND:
                    continue  # no MIG device at this index
                raise ReadError(op, card, None, f"reading MIG device {index}: {exc}") from exc
            gi_id = self._read(op, card, "reading a GI id", self._nv.nvmlDeviceGetGpuInstanceId, mig)
            ci_id = self._read(op, card, "reading a CI id", self._nv.nvmlDeviceGetComputeInstanceId, mig)
            uuid = self._read(op, card, "reading a MIG UUID", self._nv.nvmlDeviceGetUUID, mig)
            found.setdefault(gi_id, []).append((ci_id, uuid, mig))
        for devices in found.values():
            devices.sort(key=lambda d: d[0])
        return found
