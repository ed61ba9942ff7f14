"""The `nvml` driver: MIG partitions through NVIDIA's management library (nvidia-ml-py).

`pynvml` is imported when the driver is opened, not when this module is imported, so partkeeper
works on machines with neither a GPU nor the library. nvidia-ml-py passes arguments to the C
library as given (no argtypes), so every struct the header takes by pointer is passed `byref`.
The algorithm is partkeeper/drivers/mig.py; this module says how NVML is called.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from partkeeper.devices import (
    DeviceNode,
    DeviceNodeError,
    MakeNode,
    Roots,
    capability_file,
    card_nodes,
    partition_nodes,
    planned_nodes,
)
from partkeeper.drivers import mig, profiles
from partkeeper.drivers.base import (
    Card,
    CardLostError,
    ContainerEdits,
    DriverError,
    Instance,
    InUseError,
    LibraryMissing,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
    nvidia_card_edits,
    nvidia_edits,
    slot_identity,
)
from partkeeper.drivers.nvidia import tables
from partkeeper.drivers.nvidia.events import NvmlEvents
from partkeeper.drivers.nvidia.tables import model_for

__all__ = ["NvmlDriver", "model_for"]

T = TypeVar("T")


def _load() -> ModuleType:
    """nvidia-ml-py, initialised; LibraryMissing (a StartupError, one sentence) if it cannot be."""
    try:
        import pynvml  # here, not at the top: see the module docstring
    except ImportError as exc:
        raise LibraryMissing(f"nvidia-ml-py cannot be imported ({exc})") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise LibraryMissing(
            f"the NVIDIA management library (libnvidia-ml.so.1) cannot be used on this node "
            f"({exc}); install the NVIDIA driver or mount its libraries, or set PK_DRIVER=sim"
        ) from exc
    return pynvml


class NvmlBinding(mig.Binding):
    """NVML through nvidia-ml-py: handles and the host's device-node roots, nothing that changes."""

    library = "NVML"

    def __init__(self, roots: Roots) -> None:
        self.nv: ModuleType = _load()
        # Where the device nodes live on the host (PK_DRIVER_ROOT), where the kernel driver
        # publishes the MIG capability minors and /proc/devices (PK_PROC_ROOT), and how a missing
        # capability node is made (os.mknod; a test without CAP_MKNOD hands its own).
        self.roots = roots

    def close(self) -> None:
        self.read("close", None, "shutting NVML down", self.nv.nvmlShutdown)

    def events(self) -> NvmlEvents:
        return NvmlEvents(self.nv, self.count())

    # -- NVML calls with their errors mapped --------------------------------------------------

    def _code(self, exc: BaseException) -> int | None:
        return getattr(exc, "value", None)

    def read(self, op: str, card: int | None, what: str, fn: Callable[..., T], *args: Any) -> T:
        """An NVML read: any failure is a ReadError ("the read failed"), never "absent"."""
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            kind = CardLostError if self._lost(exc) else ReadError
            raise kind(op, card, None, f"{what}: {exc}") from exc

    def _lost(self, exc: BaseException) -> bool:
        return self._code(exc) == self.nv.NVML_ERROR_GPU_IS_LOST

    def _change(self, op: str, card: int, instance: str | None, what: str,
                fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            raise self._mapped(op, card, instance, what, exc) from exc

    def _mapped(
        self, op: str, card: int, instance: str | None, what: str, exc: BaseException
    ) -> DriverError:
        """An NVML change failed: in-use and not-found keep their meaning, the rest is unknown."""
        code, nv = self._code(exc), self.nv
        kind: type[DriverError] = UnknownError
        if code == nv.NVML_ERROR_GPU_IS_LOST:
            kind = CardLostError
        elif code == nv.NVML_ERROR_IN_USE:
            kind = InUseError
        elif code == nv.NVML_ERROR_NOT_FOUND and op == "destroy":
            kind = NotFoundError
        elif code == nv.NVML_ERROR_INSUFFICIENT_RESOURCES and op == "create":
            kind = PlacementError
        return kind(op, card, instance, f"{what}: {exc}")

    def _step(self, card: int, fn: Callable[..., T], *args: Any) -> T:
        """A step of a create after its GI exists: any failure is the cause of its undo."""
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            kind = CardLostError if self._lost(exc) else UnknownError
            raise kind("create", card, None, str(exc)) from exc

    # -- cards --------------------------------------------------------------------------------

    def count(self) -> int:
        return self.read("list", None, "counting devices", self.nv.nvmlDeviceGetCount)

    def device(self, op: str, card: int) -> Any:
        what = "getting the device handle"
        return self.read(op, card, what, self.nv.nvmlDeviceGetHandleByIndex, card)

    def minor(self, op: str, card: int) -> int:
        what = "reading the minor number"
        return self.read(op, card, what, self.nv.nvmlDeviceGetMinorNumber, self.device(op, card))

    def mig_modes(self, op: str, card: int, dev: Any) -> tuple[bool, bool] | None:
        nv = self.nv
        try:
            current, pending = nv.nvmlDeviceGetMigMode(dev)
        except nv.NVMLError as exc:
            if self._code(exc) == nv.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise ReadError(op, card, None, f"reading the MIG mode: {exc}") from exc
        enabled = nv.NVML_DEVICE_MIG_ENABLE
        return (current == enabled, pending == enabled)

    def card(self, op: str, index: int, dev: Any, catalogue: Callable[[], mig.Catalogue]) -> Card:
        nv = self.nv
        name = self.read(op, index, "reading the name", nv.nvmlDeviceGetName, dev)
        uuid = self.read(op, index, "reading the UUID", nv.nvmlDeviceGetUUID, dev)
        memory = self.read(op, index, "reading the memory", nv.nvmlDeviceGetMemoryInfo, dev)
        minor = self.read(op, index, "reading the minor number", nv.nvmlDeviceGetMinorNumber, dev)
        memory_mib = int(memory.total // 2**20)
        modes = self.mig_modes(op, index, dev)
        if modes is None or not modes[0]:
            return Card(index, uuid, model_for(name, memory_mib) or name, "sliced", memory_mib,
                        minor)
        info = catalogue()
        # A model missing from profiles.py, or refused, keeps NVML's name: listed, no profiles.
        return Card(index, uuid, info.model or name, "partition", memory_mib, minor, info.problem)

    def catalogue(self, op: str, card: int, dev: Any) -> mig.Catalogue:
        """NVML's name, profiles and placements of a card, checked against profiles.py
        (nvidia/tables.py says how a disagreeing card is refused)."""
        nv = self.nv
        name = self.read(op, card, "reading the name", nv.nvmlDeviceGetName, dev)
        memory = self.read(op, card, "reading the memory", nv.nvmlDeviceGetMemoryInfo, dev)
        model = model_for(name, memory.total // 2**20)
        table = profiles.MODELS[model].profiles if model else {}
        base = {getattr(nv, f"NVML_GPU_INSTANCE_PROFILE_{b}") for b in tables.BASE_GI_PROFILES}
        found: list[mig.GiProfile] = []
        for const in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = self._profile_info(op, card, dev, const)
            if info is None:
                continue
            ours = tables.match(table, info) if const in base else None
            label = ours.name if ours else tables.nvml_name(info) or f"nvml-profile-{info.id}"
            spots, unplaceable = self._placements(op, card, dev, info.id, label)
            found.append(mig.GiProfile(label, info.id, info.sliceCount, info.instanceCount, spots,
                                       ours, const, unplaceable))
        problem = tables.disagreement(found, model) if model else ""
        refused = f"{model}: {problem}" if problem else ""
        return mig.Catalogue(None if problem else model, tuple(found), refused, name)

    def _placements(
        self, op: str, card: int, dev: Any, nvml_id: int, label: str
    ) -> tuple[tuple[tuple[int, int], ...], str]:
        """A profile's placements, and NVML's answer when it has none for a profile it lists
        (NOT_SUPPORTED, INVALID_ARGUMENT: "no placements", as NVIDIA's DRA driver reads them,
        cmd/gpu-kubelet-plugin/nvlib.go); any other error is a ReadError for the card."""
        nv = self.nv
        try:
            return tables.placements(nv, dev, nvml_id), ""
        except nv.NVMLError as exc:
            if self._code(exc) in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT):
                return (), str(exc)
            raise ReadError(op, card, None, f"reading the placements of {label}: {exc}") from exc

    def _profile_info(self, op: str, card: int, dev: Any, const: int) -> Any | None:
        nv = self.nv
        try:
            return nv.nvmlDeviceGetGpuInstanceProfileInfo(dev, const)
        except nv.NVMLError as exc:
            if self._code(exc) in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT):
                return None  # the card does not offer this profile
            raise ReadError(op, card, None, f"reading GI profile {const}: {exc}") from exc

    # -- instances ----------------------------------------------------------------------------

    def gpu_instances(self, op: str, card: int, dev: Any, profile: mig.GiProfile) -> list[mig.Gi]:
        nv = self.nv
        array = (nv.c_nvmlGpuInstance_t * max(profile.max_count, 1))()
        count = ctypes.c_uint(0)
        what = f"listing {profile.name} GPU instances"
        args = (dev, profile.id, array, ctypes.byref(count))
        self.read(op, card, what, nv.nvmlDeviceGetGpuInstances, *args)
        return [self._describe(op, card, h) for h in array[: count.value]]

    def _describe(self, op: str, card: int, handle: Any) -> mig.Gi:
        info = self.read(op, card, "reading a GPU instance", self.nv.nvmlGpuInstanceGetInfo, handle)
        return mig.Gi(handle, info.id, info.profileId, info.placement.start, info.placement.size)

    def gpu_instance(
        self, op: str, card: int, dev: Any, gi_id: int, catalogue: Callable[[], mig.Catalogue]
    ) -> mig.Gi:
        nv = self.nv
        try:
            handle = nv.nvmlDeviceGetGpuInstanceById(dev, gi_id)
        except nv.NVMLError as exc:
            if self._code(exc) == nv.NVML_ERROR_NOT_FOUND:
                raise mig.NoGpuInstance(str(exc)) from exc
            if self._code(exc) == nv.NVML_ERROR_NOT_SUPPORTED:
                # nvml.h: NOT_SUPPORTED "if device doesn't have MIG mode enabled". With MIG off
                # no GPU instance exists, so the destroy is done; NVIDIA's DRA driver treats it
                # as success too (cmd/gpu-kubelet-plugin/nvlib.go, deleteMigDevice).
                raise mig.ModeSwitchedOff(str(exc)) from exc
            raise ReadError(op, card, None, f"looking up GPU instance {gi_id}: {exc}") from exc
        return self._describe(op, card, handle)

    def compute_instances(
        self, op: str, card: int, dev: Any, gis: Sequence[mig.Gi]
    ) -> dict[int, list[mig.Ci]]:
        total = self.read(op, card, "counting MIG devices", self.nv.nvmlDeviceGetMaxMigDeviceCount,
                          dev)
        return mig.walk(total, lambda index: self._mig_at(op, card, dev, index),
                        lambda mig: self._mig_ids(op, card, mig))

    def _mig_at(self, op: str, card: int, dev: Any, index: int) -> Any | None:
        nv = self.nv
        try:
            return nv.nvmlDeviceGetMigDeviceHandleByIndex(dev, index)
        except nv.NVMLError as exc:
            if self._code(exc) == nv.NVML_ERROR_NOT_FOUND:
                return None  # no MIG device at this index
            raise ReadError(op, card, None, f"reading MIG device {index}: {exc}") from exc

    def _mig_ids(self, op: str, card: int, mig: Any) -> tuple[int, int, str]:
        nv = self.nv
        return (self.read(op, card, "reading a GI id", nv.nvmlDeviceGetGpuInstanceId, mig),
                self.read(op, card, "reading a CI id", nv.nvmlDeviceGetComputeInstanceId, mig),
                self.read(op, card, "reading a MIG UUID", nv.nvmlDeviceGetUUID, mig))

    def processes(self, op: str, card: int, ci: mig.Ci) -> int:
        what = "listing the processes"
        return len(self.read(op, card, what, self.nv.nvmlDeviceGetComputeRunningProcesses,
                             ci.device))

    # -- changes ------------------------------------------------------------------------------

    def create_gi(self, card: int, dev: Any, profile: mig.GiProfile, start: int, size: int) -> Any:
        placement = self.nv.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        what = f"creating a {profile.name} GPU instance at start {start}"
        # the header takes `const nvmlGpuInstancePlacement_t *`: a pointer, not the struct
        return self._change("create", card, None, what,
                            self.nv.nvmlDeviceCreateGpuInstanceWithPlacement, dev, profile.id,
                            ctypes.byref(placement))

    def gi_id(self, card: int, gi: Any) -> int:
        return int(self._step(card, self.nv.nvmlGpuInstanceGetInfo, gi).id)

    def create_ci(self, card: int, gi: mig.Gi, profile: mig.GiProfile) -> Any:
        nv = self.nv
        assert profile.ours is not None  # legal_shape chose it
        const = getattr(nv, f"NVML_COMPUTE_INSTANCE_PROFILE_{profile.ours.compute_slices}_SLICE")
        shared = nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        ci_profile = self._step(card, nv.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi.handle,
                                const, shared)
        return self._step(card, nv.nvmlGpuInstanceCreateComputeInstance, gi.handle, ci_profile.id)

    def new_ci(self, card: int, gi: mig.Gi, handle: Any) -> mig.Ci:
        """The new CI's id, and its UUID from the CI's own device handle as NVIDIA's DRA driver
        reads it ("a MIG device handle maps 1:1 to a CI", cmd/gpu-kubelet-plugin/nvlib.go
        createMigDevice): one call instead of a walk. nvml.h calls that field the parent device,
        so an answer that is no MIG UUID, or no answer, leaves the UUID to one walk
        (`probe --check --mutate` reports which the node's NVML does)."""
        nv = self.nv
        info = self._step(card, nv.nvmlComputeInstanceGetInfo, handle)
        try:
            own = nv.nvmlDeviceGetUUID(info.device)
        except nv.NVMLError:
            own = ""  # not a handle this NVML answers for: the walk decides
        if isinstance(own, bytes):
            own = own.decode()
        return mig.Ci(info.id, str(own) if str(own).startswith("MIG-") else "", handle=handle)

    def destroy_ci(self, op: str, card: int, gi: mig.Gi, ci: mig.Ci) -> None:
        nv = self.nv
        try:
            handle = ci.handle or nv.nvmlGpuInstanceGetComputeInstanceById(gi.handle, ci.ci_id)
            nv.nvmlComputeInstanceDestroy(handle)
        except nv.NVMLError as exc:
            if self._code(exc) == nv.NVML_ERROR_NOT_FOUND:
                return  # the CI is already gone; the GI still has to go
            what = f"destroying compute instance {ci.ci_id}"
            raise self._mapped(op, card, ci.uuid or None, what, exc) from exc

    def destroy_gi(self, op: str, card: int, name: str, gi: mig.Gi) -> None:
        what = f"destroying GPU instance {gi.gi_id}"
        self._change(op, card, name, what, self.nv.nvmlGpuInstanceDestroy, gi.handle)

    # -- what a container gets ----------------------------------------------------------------

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits:
        """NVIDIA's runtime hook takes the MIG UUIDs from the env; the device nodes are the ones
        NVIDIA's device plugin passes (partkeeper/devices.py), each once however many of the
        partitions share a card. A node that cannot be named is a ReadError."""
        nodes: list[DeviceNode] = []
        for inst in instances:
            nodes.extend(n for n in self._device_nodes(inst) if n not in nodes)
        return replace(nvidia_edits(instances), devices=tuple(nodes))

    def card_edits(self, cards: Sequence[Card]) -> ContainerEdits:
        """The card UUIDs in the env, and the nodes NVIDIA's device plugin passes for whole GPUs:
        the control nodes present, then each card's `/dev/nvidia<minor>`."""
        minors = [self.minor("allocate", c.index) for c in cards]
        return replace(nvidia_card_edits(cards), devices=tuple(card_nodes(self.roots, minors)))

    def _device_nodes(self, inst: Instance) -> list[DeviceNode]:
        minor = self.minor("allocate", inst.card)
        try:
            return partition_nodes(self.roots, minor, inst.gi_id, inst.ci_id)
        except DeviceNodeError as exc:
            cause = f"its device nodes cannot be handed over: {exc}"
            raise ReadError("allocate", inst.card, inst.uuid or f"GI {inst.gi_id}", cause) from exc


class NvmlDriver(mig.MigDriver):
    """The Driver protocol over NVML, plus what `partkeeper probe --check` reads."""

    name = "nvml"
    same_partition = staticmethod(slot_identity)

    def __init__(
        self, *, root: Path = Path("/"), proc_root: Path = Path("/proc"),
        make_node: MakeNode = os.mknod,
    ) -> None:
        self.binding = NvmlBinding(Roots(root, proc_root, make_node))
        super().__init__(self.binding)

    def versions(self) -> dict[str, str]:
        """The kernel driver's and NVML's versions, for `partkeeper probe --check`."""
        nv = self.binding.nv
        read = [("driver", nv.nvmlSystemGetDriverVersion), ("nvml", nv.nvmlSystemGetNVMLVersion)]
        found = {}
        for name, fn in read:
            value = self.binding.read("probe", None, f"reading the {name} version", fn)
            found[name] = value.decode() if isinstance(value, bytes) else str(value)
        return found

    def planned_nodes(self, inst: Instance) -> list[DeviceNode]:
        """The nodes a reply for `inst` would name, none made (`partkeeper probe --check`).
        Raises ReadError naming what cannot be read."""
        roots = self.binding.roots
        try:
            return planned_nodes(roots, self.binding.minor("probe", inst.card), inst.gi_id,
                                 inst.ci_id)
        except DeviceNodeError as exc:
            where = inst.uuid or f"GI {inst.gi_id}"
            raise ReadError("probe", inst.card, where, str(exc)) from exc

    def capability_files(self, inst: Instance) -> list[Path]:
        roots, minor = self.binding.roots, self.binding.minor("probe", inst.card)
        return [capability_file(roots, minor, inst.gi_id),
                capability_file(roots, minor, inst.gi_id, inst.ci_id)]
