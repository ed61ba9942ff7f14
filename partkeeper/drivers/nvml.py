"""The `nvml` driver: MIG partitions through NVIDIA's management library (nvidia-ml-py).

`pynvml` is imported when the driver is opened, not when this module is imported, so partkeeper
(and the sim driver) work on machines with neither a GPU nor the library.

A partition is one GPU instance (GI) holding one full-size compute instance (CI); its identity is
the MIG device UUID NVML reports for that CI. Every enumeration fails closed: an NVML error while
reading is a ReadError, never an empty or shortened list. nvidia-ml-py passes arguments to the C
library as given (no argtypes), so every struct the header takes by pointer is passed `byref`.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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
from partkeeper.drivers import nvml_tables, profiles
from partkeeper.drivers.base import (
    Card,
    ContainerEdits,
    DriverError,
    Instance,
    InstanceSpec,
    InUseError,
    LibraryMissing,
    ModeOffError,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
    identity_mismatch,
    nvidia_card_edits,
    nvidia_edits,
    slot_identity,
)
from partkeeper.drivers.nvml_tables import CardInfo, GiProfile, model_for

__all__ = ["NvmlDriver", "model_for"]

T = TypeVar("T")
_Mig = tuple[int, str, Any]  # (CI id, MIG device UUID, MIG device handle)


@dataclass(frozen=True, slots=True)
class _Gi:
    handle: Any
    gi_id: int
    profile: str
    start: int
    size: int


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


class NvmlDriver:
    """The Driver protocol over NVML. Holds handles and static card facts, nothing that changes."""

    name = "nvml"
    same_partition = staticmethod(slot_identity)

    def __init__(
        self, *, root: Path = Path("/"), proc_root: Path = Path("/proc"),
        make_node: MakeNode = os.mknod,
    ) -> None:
        self._nv: ModuleType = _load()
        self._info: dict[int, CardInfo] = {}
        # Where the device nodes live on the host (PK_DRIVER_ROOT), where the kernel driver
        # publishes the MIG capability minors and /proc/devices (PK_PROC_ROOT), and how a missing
        # capability node is made (os.mknod; a test without CAP_MKNOD hands its own).
        self._roots = Roots(root, proc_root, make_node)
        # Where the last create found its UUID: "ci handle" (the CI's own device, one call) or
        # "walk" (NVML named the parent card); for `partkeeper probe --check --mutate`.
        self.uuid_source = ""

    def close(self) -> None:
        self._read("close", None, "shutting NVML down", self._nv.nvmlShutdown)

    # -- NVML calls with their errors mapped --------------------------------------------------

    def _code(self, exc: BaseException) -> int | None:
        return getattr(exc, "value", None)

    def _read(self, op: str, card: int | None, what: str, fn: Callable[..., T], *args: Any) -> T:
        """An NVML read: any failure is a ReadError ("the read failed"), never "absent"."""
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            raise ReadError(op, card, None, f"{what}: {exc}") from exc

    def _mapped(
        self, op: str, card: int, instance: str | None, what: str, exc: BaseException
    ) -> DriverError:
        """An NVML change failed: in-use and not-found keep their meaning, the rest is unknown."""
        code, nv = self._code(exc), self._nv
        kind: type[DriverError] = UnknownError
        if code == nv.NVML_ERROR_IN_USE:
            kind = InUseError
        elif code == nv.NVML_ERROR_NOT_FOUND and op == "destroy":
            kind = NotFoundError
        elif code == nv.NVML_ERROR_INSUFFICIENT_RESOURCES and op == "create":
            kind = PlacementError
        return kind(op, card, instance, f"{what}: {exc}")

    def device(self, op: str, card: int) -> Any:
        what = "getting the device handle"
        return self._read(op, card, what, self._nv.nvmlDeviceGetHandleByIndex, card)

    def mig_modes(self, op: str, card: int, dev: Any) -> tuple[bool, bool] | None:
        """(current, pending) MIG mode, or None for a card without MIG at all."""
        nv = self._nv
        try:
            current, pending = nv.nvmlDeviceGetMigMode(dev)
        except nv.NVMLError as exc:
            if self._code(exc) == nv.NVML_ERROR_NOT_SUPPORTED:
                return None
            raise ReadError(op, card, None, f"reading the MIG mode: {exc}") from exc
        enabled = nv.NVML_DEVICE_MIG_ENABLE
        return (current == enabled, pending == enabled)

    def _mig_enabled(self, op: str, card: int, dev: Any) -> bool:
        modes = self.mig_modes(op, card, dev)
        return modes is not None and modes[0]  # a card without MIG at all is sliced

    # -- static card facts --------------------------------------------------------------------

    def card_info(self, op: str, card: int, dev: Any) -> CardInfo:
        """NVML's name, profiles and placements of a card, checked against profiles.py; cached,
        because none of them changes while MIG mode stays as it is."""
        if card in self._info:
            return self._info[card]
        nv = self._nv
        name = self._read(op, card, "reading the name", nv.nvmlDeviceGetName, dev)
        memory = self._read(op, card, "reading the memory", nv.nvmlDeviceGetMemoryInfo, dev)
        model = model_for(name, memory.total // 2**20)
        table = profiles.MODELS[model].profiles if model else {}
        base = {getattr(nv, f"NVML_GPU_INSTANCE_PROFILE_{b}") for b in nvml_tables.BASE_GI_PROFILES}
        found: list[GiProfile] = []
        for const in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = self._profile_info(op, card, dev, const)
            if info is None:
                continue
            ours = nvml_tables.match(table, info) if const in base else None
            label = ours.name if ours else nvml_tables.nvml_name(info) or f"nvml-profile-{info.id}"
            spots, unplaceable = self._placements(op, card, dev, info.id, label)
            found.append(
                GiProfile(label, const, info.id, info.instanceCount, spots, ours, unplaceable)
            )
        problem = nvml_tables.disagreement(found, model) if model else ""
        refused = model if problem else None
        self._info[card] = CardInfo(name, None if problem else model, tuple(found),
                                    f"{refused}: {problem}" if problem else "")
        return self._info[card]

    def _placements(
        self, op: str, card: int, dev: Any, nvml_id: int, label: str
    ) -> tuple[tuple[tuple[int, int], ...], str]:
        """A profile's placements, and NVML's answer when it has none for a profile it lists
        (NOT_SUPPORTED, INVALID_ARGUMENT: "no placements", as NVIDIA's DRA driver reads them,
        cmd/gpu-kubelet-plugin/nvlib.go); any other error is a ReadError for the card."""
        nv = self._nv
        try:
            return nvml_tables.placements(nv, dev, nvml_id), ""
        except nv.NVMLError as exc:
            if self._code(exc) in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT):
                return (), str(exc)
            raise ReadError(op, card, None, f"reading the placements of {label}: {exc}") from exc

    def _profile_info(self, op: str, card: int, dev: Any, const: int) -> Any | None:
        nv = self._nv
        try:
            return nv.nvmlDeviceGetGpuInstanceProfileInfo(dev, const)
        except nv.NVMLError as exc:
            if self._code(exc) in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT):
                return None  # the card does not offer this profile
            raise ReadError(op, card, None, f"reading GI profile {const}: {exc}") from exc

    # -- enumeration --------------------------------------------------------------------------

    def cards(self) -> list[Card]:
        count = self._read("list", None, "counting devices", self._nv.nvmlDeviceGetCount)
        return [self._card(index) for index in range(count)]

    def _card(self, index: int) -> Card:
        nv, op = self._nv, "list"
        dev = self.device(op, index)
        name = self._read(op, index, "reading the name", nv.nvmlDeviceGetName, dev)
        uuid = self._read(op, index, "reading the UUID", nv.nvmlDeviceGetUUID, dev)
        memory = self._read(op, index, "reading the memory", nv.nvmlDeviceGetMemoryInfo, dev)
        minor = self._read(op, index, "reading the minor number", nv.nvmlDeviceGetMinorNumber, dev)
        memory_mib = int(memory.total // 2**20)
        if not self._mig_enabled(op, index, dev):
            return Card(index, uuid, model_for(name, memory_mib) or name, "sliced", memory_mib,
                        minor)
        info = self.card_info(op, index, dev)
        # A model missing from profiles.py, or refused, keeps NVML's name: listed, no profiles.
        return Card(index, uuid, info.model or name, "partition", memory_mib, minor, info.problem)

    def instances(self, card: int) -> list[Instance]:
        dev = self.device("list", card)
        if not self._mig_enabled("list", card, dev):
            return []
        return self._listed("list", card, dev)

    def _listed(self, op: str, card: int, dev: Any) -> list[Instance]:
        """The card's instances, MIG enabled: the GPU instances and one walk of the MIG devices."""
        gis = self._gpu_instances(op, card, dev)
        migs = self._mig_devices(op, card, dev)
        return [_instance(card, gi, migs.get(gi.gi_id, [])) for gi in gis]

    def _gpu_instances(self, op: str, card: int, dev: Any) -> list[_Gi]:
        nv = self._nv
        found: list[_Gi] = []
        for prof in self.card_info(op, card, dev).gi_profiles:
            array = (nv.c_nvmlGpuInstance_t * max(prof.max_count, 1))()
            count = ctypes.c_uint(0)
            what = f"listing {prof.name} GPU instances"
            args = (dev, prof.nvml_id, array, ctypes.byref(count))
            self._read(op, card, what, nv.nvmlDeviceGetGpuInstances, *args)
            found.extend(self._describe(op, card, dev, h) for h in array[: count.value])
        return sorted(found, key=lambda gi: gi.start)

    def _describe(self, op: str, card: int, dev: Any, handle: Any) -> _Gi:
        what = "reading a GPU instance"
        info = self._read(op, card, what, self._nv.nvmlGpuInstanceGetInfo, handle)
        known = self.card_info(op, card, dev).gi_profiles
        name = next((p.name for p in known if p.nvml_id == info.profileId), None)
        place = info.placement
        label = name or f"nvml-profile-{info.profileId}"
        return _Gi(handle, info.id, label, place.start, place.size)

    def _mig_devices(self, op: str, card: int, dev: Any) -> dict[int, list[_Mig]]:
        """The MIG devices (one per CI) by GI id, lowest CI id first: a walk of every MIG device
        index, four NVML calls each, which NVIDIA measured at seconds under load
        (k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/nvlib.go createMigDevice). So every
        operation walks at most once and passes the result down."""
        nv = self._nv
        total = self._read(op, card, "counting MIG devices", nv.nvmlDeviceGetMaxMigDeviceCount, dev)
        found: dict[int, list[_Mig]] = {}
        for index in range(total):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(dev, index)
            except nv.NVMLError as exc:
                if self._code(exc) == nv.NVML_ERROR_NOT_FOUND:
                    continue  # no MIG device at this index
                raise ReadError(op, card, None, f"reading MIG device {index}: {exc}") from exc
            gi_id = self._read(op, card, "reading a GI id", nv.nvmlDeviceGetGpuInstanceId, mig)
            ci_id = self._read(op, card, "reading a CI id", nv.nvmlDeviceGetComputeInstanceId, mig)
            uuid = self._read(op, card, "reading a MIG UUID", nv.nvmlDeviceGetUUID, mig)
            found.setdefault(gi_id, []).append((ci_id, uuid, mig))
        for devices in found.values():
            devices.sort(key=lambda d: d[0])
        return found

    def processes(self, op: str, card: int, gi_id: int) -> int:
        """How many processes run on the MIG devices of GPU instance `gi_id`."""
        devices = self._mig_devices(op, card, self.device(op, card)).get(gi_id, [])
        return self._running(op, card, devices)

    def _running(self, op: str, card: int, devices: list[_Mig]) -> int:
        what = "listing the processes"
        read = self._nv.nvmlDeviceGetComputeRunningProcesses
        return sum(len(self._read(op, card, what, read, mig)) for _, _, mig in devices)

    # -- changes ------------------------------------------------------------------------------

    def create(self, spec: InstanceSpec) -> Instance:
        """Create a partition at `spec`. A GPU instance without compute instance exactly at
        `spec` (a create interrupted between its two steps) is completed instead."""
        op, card = "create", spec.card
        dev = self.device(op, card)
        if not self._mig_enabled(op, card, dev):
            raise PlacementError(op, card, None, "MIG mode is not enabled on the card")
        gi_profile, ours = self._legal(spec, dev)
        existing = self._listed(op, card, dev)  # a failed read refuses the create (fail closed)
        for other in existing:
            if (other.profile, other.start) == (spec.profile, spec.start) and not other.complete:
                return self._finish_leftover(spec, ours, dev, other)
            if profiles.overlaps((spec.start, ours.size), other.placement):
                end = spec.start + ours.size - 1
                cause = f"slices {spec.start}-{end} overlap this {other.profile}"
                raise PlacementError(op, card, other.uuid or f"GI {other.gi_id}", cause)
        return self._complete(spec, ours, dev, self._create_gi(spec, ours, dev, gi_profile))

    def _create_gi(self, spec: InstanceSpec, ours: profiles.Profile, dev: Any, gp: GiProfile):
        nv = self._nv
        placement = nv.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = spec.start, ours.size
        try:  # the header takes `const nvmlGpuInstancePlacement_t *`: a pointer, not the struct
            place = ctypes.byref(placement)
            return nv.nvmlDeviceCreateGpuInstanceWithPlacement(dev, gp.nvml_id, place)
        except nv.NVMLError as exc:
            what = f"creating a {spec.profile} GPU instance at start {spec.start}"
            raise self._mapped("create", spec.card, None, what, exc) from exc

    def _finish_leftover(self, spec: InstanceSpec, ours: profiles.Profile, dev: Any, gi: Instance):
        what = f"reopening GPU instance {gi.gi_id}"
        handle = self._read("create", spec.card, what, self._nv.nvmlDeviceGetGpuInstanceById,
                            dev, gi.gi_id)
        return self._complete(spec, ours, dev, handle)

    def _legal(self, spec: InstanceSpec, dev: Any) -> tuple[GiProfile, profiles.Profile]:
        info = self.card_info("create", spec.card, dev)
        if info.model is None:
            cause = info.problem or "the card's model is not in partkeeper's profile tables"
            raise PlacementError("create", spec.card, None, cause)
        chosen = next((p for p in info.gi_profiles if p.ours and p.name == spec.profile), None)
        if chosen is None or chosen.ours is None:
            cause = f"{info.model} offers no GPU-instance profile {spec.profile!r} through NVML"
            raise PlacementError("create", spec.card, None, cause)
        if spec.start not in chosen.ours.starts:
            legal = ", ".join(map(str, chosen.ours.starts))
            cause = f"start {spec.start} is not a legal placement of {spec.profile} ({legal})"
            raise PlacementError("create", spec.card, None, cause)
        return chosen, chosen.ours

    def _complete(self, spec: InstanceSpec, ours: profiles.Profile, dev: Any, gi: Any) -> Instance:
        """Give the GI its full-size CI and find its UUID; on any failure, undo the GI."""
        nv = self._nv
        ci: Any = None
        step = "reading the new GPU instance"
        try:
            gi_id = nv.nvmlGpuInstanceGetInfo(gi).id
            step = "creating its compute instance"
            const = getattr(nv, f"NVML_COMPUTE_INSTANCE_PROFILE_{ours.compute_slices}_SLICE")
            shared = nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            ci_profile = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, const, shared)
            ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
            ci_info = nv.nvmlComputeInstanceGetInfo(ci)
            ci_id = ci_info.id
            step = "finding its MIG device UUID"
            uuid = self._new_uuid(spec.card, dev, ci_info, gi_id)
        except (nv.NVMLError, DriverError, StopIteration) as exc:
            cause = f"{step} failed ({str(exc) or 'no MIG device reports it'})"
            raise self._undo(spec, gi, ci, cause) from exc
        return Instance(spec.card, spec.profile, spec.start, ours.size, gi_id, ci_id, uuid)

    def _new_uuid(self, card: int, dev: Any, ci_info: Any, gi_id: int) -> str:
        """The UUID of a new CI's MIG device, from the CI's own device handle as NVIDIA's DRA
        driver reads it ("a MIG device handle maps 1:1 to a CI", cmd/gpu-kubelet-plugin/nvlib.go
        createMigDevice): one call instead of a walk. nvml.h calls that field the parent device,
        so an answer that is no MIG UUID, or no answer, falls back to one walk (`probe --check
        --mutate` reports which the node's NVML does). Raises NVMLError, DriverError or
        StopIteration."""
        nv = self._nv
        try:
            own = nv.nvmlDeviceGetUUID(ci_info.device)
        except nv.NVMLError:
            own = ""  # not a handle this NVML answers for: the walk decides
        if isinstance(own, bytes):
            own = own.decode()
        if own.startswith("MIG-"):
            self.uuid_source = "ci handle"
            return str(own)
        self.uuid_source = "walk"
        found = self._mig_devices("create", card, dev).get(gi_id, [])
        return next(u for c, u, _ in found if c == ci_info.id)

    def _undo(self, spec: InstanceSpec, gi: Any, ci: Any, cause: str) -> UnknownError:
        """Destroy a GI this create made and cannot finish: no half-made partition stays behind."""
        nv = self._nv
        what = f"the {spec.profile} GPU instance at start {spec.start} was created but {cause}"
        try:
            if ci is not None:
                nv.nvmlComputeInstanceDestroy(ci)
            nv.nvmlGpuInstanceDestroy(gi)
        except nv.NVMLError as exc:
            return UnknownError("create", spec.card, None, f"{what}; undoing it failed too ({exc})")
        return UnknownError("create", spec.card, None, f"{what}; it was destroyed again")

    def destroy(self, expected: Instance) -> None:
        nv, op, card = self._nv, "destroy", expected.card
        name = expected.uuid or f"GI {expected.gi_id}"
        dev = self.device(op, card)
        try:
            handle = nv.nvmlDeviceGetGpuInstanceById(dev, expected.gi_id)
        except nv.NVMLError as exc:
            if self._code(exc) == nv.NVML_ERROR_NOT_FOUND:
                cause = f"no GPU instance {expected.gi_id} exists"
                raise NotFoundError(op, card, name, cause) from exc
            if self._code(exc) == nv.NVML_ERROR_NOT_SUPPORTED:
                # nvml.h: NOT_SUPPORTED "if device doesn't have MIG mode enabled". With MIG off
                # no GPU instance exists, so the destroy is done; NVIDIA's DRA driver treats it
                # as success too (cmd/gpu-kubelet-plugin/nvlib.go, deleteMigDevice).
                cause = (f"NVML answers {exc} for GPU instance {expected.gi_id}: MIG mode was "
                         "switched off on the card, so no GPU instance can exist on it")
                raise ModeOffError(op, card, name, cause) from exc
            cause = f"looking up GPU instance {expected.gi_id}: {exc}"
            raise ReadError(op, card, name, cause) from exc
        gi = self._describe(op, card, dev, handle)
        cis = self._mig_devices(op, card, dev).get(expected.gi_id, [])
        found = _instance(card, gi, [m for m in cis if m[1] == expected.uuid] or cis)
        if not self.same_partition(expected, found):
            raise identity_mismatch(expected, found)
        for ci_id, uuid, _ in cis:
            self._destroy_ci(handle, card, ci_id, uuid)
        try:
            nv.nvmlGpuInstanceDestroy(handle)
        except nv.NVMLError as exc:
            what = f"destroying GPU instance {expected.gi_id}"
            raise self._mapped(op, card, name, what, exc) from exc

    def _destroy_ci(self, gi: Any, card: int, ci_id: int, uuid: str) -> None:
        nv = self._nv
        try:
            nv.nvmlComputeInstanceDestroy(nv.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id))
        except nv.NVMLError as exc:
            if self._code(exc) == nv.NVML_ERROR_NOT_FOUND:
                return  # the CI is already gone; the GI still has to go
            what = f"destroying compute instance {ci_id}"
            raise self._mapped("destroy", card, uuid, what, exc) from exc

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
        minors = [self._minor(c.index) for c in cards]
        return replace(nvidia_card_edits(cards), devices=tuple(card_nodes(self._roots, minors)))

    def _minor(self, card: int) -> int:
        dev = self.device("allocate", card)
        what = "reading the minor number"
        return self._read("allocate", card, what, self._nv.nvmlDeviceGetMinorNumber, dev)

    def _device_nodes(self, inst: Instance) -> list[DeviceNode]:
        op, card = "allocate", inst.card
        minor = self._minor(card)
        try:
            return partition_nodes(self._roots, minor, inst.gi_id, inst.ci_id)
        except DeviceNodeError as exc:
            cause = f"its device nodes cannot be handed over: {exc}"
            raise ReadError(op, card, inst.uuid or f"GI {inst.gi_id}", cause) from exc

    def versions(self) -> dict[str, str]:
        """The kernel driver's and NVML's versions, for `partkeeper probe --check`."""
        nv = self._nv
        read = [("driver", nv.nvmlSystemGetDriverVersion), ("nvml", nv.nvmlSystemGetNVMLVersion)]
        found = {}
        for name, fn in read:
            value = self._read("probe", None, f"reading the {name} version", fn)
            found[name] = value.decode() if isinstance(value, bytes) else str(value)
        return found

    def planned_nodes(self, inst: Instance) -> list[DeviceNode]:
        """The nodes a reply for `inst` would name, none made (`partkeeper probe --check`).
        Raises ReadError naming what cannot be read."""
        try:
            return planned_nodes(self._roots, self._minor(inst.card), inst.gi_id, inst.ci_id)
        except DeviceNodeError as exc:
            where = inst.uuid or f"GI {inst.gi_id}"
            raise ReadError("probe", inst.card, where, str(exc)) from exc

    def capability_files(self, inst: Instance) -> list[Path]:
        minor = self._minor(inst.card)
        return [capability_file(self._roots, minor, inst.gi_id),
                capability_file(self._roots, minor, inst.gi_id, inst.ci_id)]

    def probe_view(self, card: int) -> dict[str, Any]:
        """MIG mode (current and pending) and NVML's profiles beside the tables, for
        `partkeeper probe` (read-only)."""
        dev = self.device("probe", card)
        modes = self.mig_modes("probe", card, dev)
        view: dict[str, Any] = {
            "mig": None if modes is None else {"current": modes[0], "pending": modes[1]},
            "profiles": [],
        }
        if modes is not None and modes[0]:
            info = self.card_info("probe", card, dev)
            view["nvml_name"] = info.nvml_name
            view["profiles"] = [nvml_tables.profile_view(p) for p in info.gi_profiles]
        return view

    def is_busy(self, instance: Instance) -> bool:
        op, card = "busy", instance.card
        devices = self._mig_devices(op, card, self.device(op, card)).get(instance.gi_id, [])
        if instance.uuid and all(uuid != instance.uuid for _, uuid, _ in devices):
            cause = f"no MIG device of GPU instance {instance.gi_id} has this UUID"
            raise NotFoundError(op, card, instance.uuid, cause)
        return self._running(op, card, devices) > 0  # the same walk, not a second one


def _instance(card: int, gi: _Gi, devices: list[_Mig]) -> Instance:
    # A GI without a CI (an interrupted create or destroy, or carved by hand) still occupies its
    # slices: listed with CI id -1 and no UUID rather than left out.
    ci_id, uuid = (devices[0][0], devices[0][1]) if devices else (-1, "")
    return Instance(card, gi.profile, gi.start, gi.size, gi.gi_id, ci_id, uuid)
