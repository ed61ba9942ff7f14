"""The `hgml` driver: T-Head PPU partitions through libhgml.so (ctypes; see hgml_api.py).

HGML is NVML-shaped, so the model is NVIDIA's: a partition is one GPU instance (GI) with one
compute instance (CI) spanning it; ids are per card; the partition's identity is the MIG device
UUID the library reports for the CI, and (as NVIDIA's) a successor at the same slot may reproduce
it, which is why only claims tell them apart. What differs: profiles are found by probing indices
0..84 (an index is not the profile id) and matched by normalised name; the container gets device
nodes, not an environment variable (thead_nodes.py). Every enumeration fails closed.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from partkeeper.drivers import hgml_api as api
from partkeeper.drivers import hgml_profiles, profiles, thead_nodes, vendor
from partkeeper.drivers.base import (
    Card,
    ContainerEdits,
    DriverError,
    Instance,
    InstanceSpec,
    LibraryMissing,
    Mode,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
    identity_mismatch,
    slot_identity,
)
from partkeeper.drivers.clib import (
    ERROR_INSUFFICIENT_RESOURCES,
    ERROR_INSUFFICIENT_SIZE,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    CallFailed,
    call,
    change_call,
    read_call,
    text,
)
from partkeeper.drivers.hgml_profiles import CardInfo, GiProfile

# INSUFFICIENT_RESOURCES from a create: the placement is taken (HGML answers as NVML does).
_CREATE_PLACEMENT = frozenset({ERROR_INSUFFICIENT_RESOURCES})
_Mig = tuple[int, str, api.Handle]  # (CI id, MIG device UUID, MIG device handle)


class HgmlDriver:
    """The Driver protocol over HGML. Holds the library and static card facts only."""

    name = "hgml"
    same_partition = staticmethod(slot_identity)

    def __init__(
        self, *, root: Path = Path("/"), proc_root: Path | None = None,
        paths: list[str] | None = None,
    ) -> None:
        try:
            self._api = api.load(paths)
        except (LibraryMissing, AttributeError) as exc:
            raise LibraryMissing(f"T-Head HGML: {exc}; install the vendor's driver and SDK on the "
                                 "node, or set PK_DRIVER=sim") from exc
        self.root = root  # where the driver's /dev lives on the host (PK_DRIVER_ROOT)
        self.proc_root = proc_root or root / "proc"  # where /proc/driver/alixpu is read
        self._info: dict[int, CardInfo] = {}
        try:
            call(self._api.Init)
        except CallFailed as exc:
            raise LibraryMissing(f"T-Head HGML ({self._api.lib.path}) cannot be initialised "
                                 f"({exc}); is the PPU driver loaded?") from exc

    @property
    def library_path(self) -> str:
        return self._api.lib.path

    def close(self) -> None:
        self._call("close", None, "shutting HGML down", self._api.hgmlShutdown)

    # -- calls with their errors mapped -------------------------------------------------------

    _call = staticmethod(read_call)  # a read: any failure is a ReadError, never "absent"

    def _change(self, op: str, card: int, name: str | None, what: str, fn: Any, *args: Any) -> None:
        codes = _CREATE_PLACEMENT if op == "create" else frozenset()
        change_call(op, card, name, what, fn, *args, placement_codes=codes)

    def _device(self, op: str, card: int) -> api.Handle:
        dev = api.Handle()
        self._call(
            op,
            card,
            "getting the device handle",
            self._api.DeviceGetHandleByIndex,
            card,
            ctypes.byref(dev),
        )
        return dev

    def _string(self, op: str, card: int, what: str, fn: Any, dev: api.Handle) -> str:
        buf = ctypes.create_string_buffer(api.UUID_SIZE)
        self._call(op, card, what, fn, dev, buf, api.UUID_SIZE)
        return text(buf.raw)

    def _uint(self, op: str, card: int, what: str, fn: Any, *args: Any) -> int:
        out = ctypes.c_uint(0)
        self._call(op, card, what, fn, *args, ctypes.byref(out))
        return out.value

    def _minor(self, op: str, card: int, dev: api.Handle) -> int:
        """The PPU node's kernel minor, as HGML reports it (`/dev/alixpu_ppu<ordinal>` must have
        it)."""
        return self._uint(op, card, "reading the minor number",
                          self._api.hgmlDeviceGetMinorNumber, dev)

    def _mig_enabled(self, op: str, card: int, dev: api.Handle) -> bool:
        current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
        try:
            call(self._api.hgmlDeviceGetMigMode, dev, ctypes.byref(current), ctypes.byref(pending))
        except CallFailed as exc:
            if exc.code == ERROR_NOT_SUPPORTED:
                return False  # a PPU without MIG is sliced
            raise ReadError(op, card, None, f"reading the MIG mode: {exc}") from exc
        return current.value == api.MIG_ENABLE

    # -- static card facts --------------------------------------------------------------------

    def _card_info(self, op: str, card: int, dev: api.Handle) -> CardInfo:
        """Model, minor and GI profiles; cached once non-empty (they change only with the mode,
        which partkeeper picks up by restarting; an empty catalogue is what a card with the mode
        off reads as, so it is not remembered)."""
        if card in self._info:
            return self._info[card]
        memory = api.Memory()
        self._call(
            op,
            card,
            "reading the memory",
            self._api.hgmlDeviceGetMemoryInfo,
            dev,
            ctypes.byref(memory),
        )
        minor = self._minor(op, card, dev)
        found = hgml_profiles.probe(self._api, op, card, dev)
        info = CardInfo(vendor.model_for("thead", memory.total // 2**20), minor, found)
        if found:
            self._info[card] = info
        return info

    # -- enumeration --------------------------------------------------------------------------

    def cards(self) -> list[Card]:
        count = self._uint("list", None, "counting devices", self._api.DeviceGetCount)  # type: ignore[arg-type]
        return [self._card(index) for index in range(count)]

    def _card(self, index: int) -> Card:
        dev = self._device("list", index)
        name = self._string("list", index, "reading the name", self._api.hgmlDeviceGetName, dev)
        uuid = self._string("list", index, "reading the UUID", self._api.hgmlDeviceGetUUID, dev)
        mode: Mode = "partition" if self._mig_enabled("list", index, dev) else "sliced"
        memory = api.Memory()
        self._call(
            "list",
            index,
            "reading the memory",
            self._api.hgmlDeviceGetMemoryInfo,
            dev,
            ctypes.byref(memory),
        )
        memory_mib = int(memory.total // 2**20)
        model = vendor.model_for("thead", memory_mib)
        minor = self._minor("list", index, dev)
        return Card(index, uuid, model or name, mode, memory_mib, minor=minor)

    def instances(self, card: int) -> list[Instance]:
        dev = self._device("list", card)
        if not self._mig_enabled("list", card, dev):
            return []
        migs = self._mig_devices("list", card, dev)
        return [
            _instance(card, gi_id, label, start, size, migs.get(gi_id, []))
            for gi_id, label, start, size, _ in self._gpu_instances("list", card, dev)
        ]

    def _gpu_instances(
        self, op: str, card: int, dev: api.Handle
    ) -> list[tuple[int, str, int, int, api.Handle]]:
        info = self._card_info(op, card, dev)
        found = []
        for prof in info.gi_profiles:
            array = (api.Handle * api.MAX_INSTANCES)()
            count = ctypes.c_uint(api.MAX_INSTANCES)
            self._call(
                op,
                card,
                f"listing {prof.name} GPU instances",
                self._api.hgmlDeviceGetGpuInstances,
                dev,
                prof.id,
                array,
                ctypes.byref(count),
            )
            for handle in array[: count.value]:
                gi = self._gi_info(op, card, handle)
                label = (info.by_id(gi.profileId) or prof).name
                found.append((gi.id, label, gi.placement.start, gi.placement.size, handle))
        return sorted(found, key=lambda g: g[2])

    def _gi_info(self, op: str, card: int, handle: api.Handle) -> api.GpuInstanceInfo:
        info = api.GpuInstanceInfo()
        self._call(
            op,
            card,
            "reading a GPU instance",
            self._api.hgmlGpuInstanceGetInfo,
            handle,
            ctypes.byref(info),
        )
        return info

    def _mig_devices(self, op: str, card: int, dev: api.Handle) -> dict[int, list[_Mig]]:
        """The MIG devices (one per CI) by GI id, lowest CI id first."""
        a = self._api
        total = self._uint(op, card, "counting MIG devices", a.hgmlDeviceGetMaxMigDeviceCount, dev)
        found: dict[int, list[_Mig]] = {}
        for index in range(total):
            mig = api.Handle()
            try:
                call(a.hgmlDeviceGetMigDeviceHandleByIndex, dev, index, ctypes.byref(mig))
            except CallFailed as exc:
                if exc.code == ERROR_NOT_FOUND:
                    continue  # no MIG device at this index
                raise ReadError(op, card, None, f"reading MIG device {index}: {exc}") from exc
            gi_id = self._uint(op, card, "reading a GI id", a.hgmlDeviceGetGpuInstanceId, mig)
            ci_id = self._uint(op, card, "reading a CI id", a.hgmlDeviceGetComputeInstanceId, mig)
            uuid = self._string(op, card, "reading a MIG UUID", a.hgmlDeviceGetUUID, mig)
            found.setdefault(gi_id, []).append((ci_id, uuid, mig))
        for devices in found.values():
            devices.sort(key=lambda d: d[0])
        return found

    # -- changes ------------------------------------------------------------------------------

    def create(self, spec: InstanceSpec) -> Instance:
        op, card = "create", spec.card
        dev = self._device(op, card)
        if not self._mig_enabled(op, card, dev):
            raise PlacementError(op, card, None, "MIG mode is not enabled on the PPU")
        info = self._card_info(op, card, dev)
        chosen = next((p for p in info.gi_profiles if p.offered and p.name == spec.profile), None)
        offered = [p.name for p in info.gi_profiles if p.offered]
        ours = vendor.legal_shape(spec, info.model, offered, chosen.placements if chosen else ())
        assert chosen is not None  # legal_shape refused otherwise
        existing = self.instances(card)  # fails closed on a bad read
        leftover = vendor.leftover_at(spec, existing)
        if leftover is not None:
            return self._complete(spec, ours, chosen, dev, self._gi_by_id(op, card, dev, leftover))
        vendor.refuse_overlap(spec, ours.size, existing)
        placement = api.Placement(spec.start, ours.size)
        gi = api.Handle()
        what = f"creating a {spec.profile} GPU instance at start {spec.start}"
        self._change(
            op,
            card,
            None,
            what,
            self._api.hgmlDeviceCreateGpuInstanceWithPlacement,
            dev,
            chosen.id,
            ctypes.byref(placement),
            ctypes.byref(gi),
        )
        return self._complete(spec, ours, chosen, dev, gi)

    def _complete(
        self,
        spec: InstanceSpec,
        ours: profiles.Profile,
        chosen: GiProfile,
        dev: api.Handle,
        gi: api.Handle,
    ) -> Instance:
        """Give the new GI its whole-GI CI and find its UUID; on any failure, undo the GI."""
        ci: api.Handle | None = None
        step = "reading the new GPU instance"
        try:
            gi_id = self._gi_info("create", spec.card, gi).id
            step = "choosing its compute profile"
            ci_profile = hgml_profiles.whole_compute_profile(self._api, spec.card, gi, chosen)
            step = "creating its compute instance"
            made = api.Handle()
            call(self._api.hgmlGpuInstanceCreateComputeInstance, gi, ci_profile, ctypes.byref(made))
            ci = made
            ci_info = api.ComputeInstanceInfo()
            call(self._api.ComputeInstanceGetInfo, ci, ctypes.byref(ci_info))
            step = "finding its MIG device UUID"
            found = self._mig_devices("create", spec.card, dev).get(gi_id, [])
            uuid = next(u for c, u, _ in found if c == ci_info.id)
        except (CallFailed, DriverError, StopIteration) as exc:
            detail = exc.cause if isinstance(exc, DriverError) else str(exc)
            cause = f"{step} failed ({detail or 'no MIG device reports it'})"
            raise self._undo(spec, gi, ci, cause) from exc
        return Instance(spec.card, spec.profile, spec.start, ours.size, gi_id, ci_info.id, uuid)

    def _gi_by_id(self, op: str, card: int, dev: api.Handle, inst: Instance) -> api.Handle:
        handle = api.Handle()
        self._call(
            op,
            card,
            f"looking up GPU instance {inst.gi_id}",
            self._api.hgmlDeviceGetGpuInstanceById,
            dev,
            inst.gi_id,
            ctypes.byref(handle),
        )
        return handle

    def _undo(
        self, spec: InstanceSpec, gi: api.Handle, ci: api.Handle | None, cause: str
    ) -> UnknownError:
        destroy_ci = (None if ci is None
                      else functools.partial(call, self._api.hgmlComputeInstanceDestroy, ci))
        return vendor.undo_create(spec, cause, destroy_ci,
                                  functools.partial(call, self._api.hgmlGpuInstanceDestroy, gi))

    def destroy(self, expected: Instance) -> None:
        op, card = "destroy", expected.card
        name = expected.uuid or f"GI {expected.gi_id}"
        dev = self._device(op, card)
        handle = api.Handle()
        try:
            call(self._api.hgmlDeviceGetGpuInstanceById, dev, expected.gi_id, ctypes.byref(handle))
        except CallFailed as exc:
            if exc.code == ERROR_NOT_FOUND:
                raise NotFoundError(
                    op, card, name, f"no GPU instance {expected.gi_id} exists"
                ) from exc
            raise ReadError(
                op, card, name, f"looking up GPU instance {expected.gi_id}: {exc}"
            ) from exc
        gi = self._gi_info(op, card, handle)
        known = self._card_info(op, card, dev).by_id(gi.profileId)
        cis = self._mig_devices(op, card, dev).get(expected.gi_id, [])
        label = known.name if known else f"hgml-profile-{gi.profileId}"
        mine = [m for m in cis if m[1] == expected.uuid] or cis
        found = _instance(card, gi.id, label, gi.placement.start, gi.placement.size, mine)
        if not self.same_partition(expected, found):
            raise identity_mismatch(expected, found)
        for ci_id, uuid, _ in cis:
            ci = api.Handle()
            try:
                call(
                    self._api.hgmlGpuInstanceGetComputeInstanceById, handle, ci_id, ctypes.byref(ci)
                )
            except CallFailed as exc:
                if exc.code == ERROR_NOT_FOUND:
                    continue  # the CI is already gone; the GI still has to go
                raise ReadError(
                    op, card, uuid, f"looking up compute instance {ci_id}: {exc}"
                ) from exc
            self._change(
                op,
                card,
                uuid,
                f"destroying compute instance {ci_id}",
                self._api.hgmlComputeInstanceDestroy,
                ci,
            )
        self._change(
            op,
            card,
            name,
            f"destroying GPU instance {expected.gi_id}",
            self._api.hgmlGpuInstanceDestroy,
            handle,
        )

    def is_busy(self, instance: Instance) -> bool:
        op, card = "busy", instance.card
        dev = self._device(op, card)
        devices = self._mig_devices(op, card, dev).get(instance.gi_id, [])
        if not devices:
            cause = (
                f"no MIG device addresses GPU instance {instance.gi_id}; cannot tell who uses it"
            )
            raise ReadError(op, card, instance.uuid or None, cause)
        if instance.uuid and all(uuid != instance.uuid for _, uuid, _ in devices):
            raise NotFoundError(op, card, instance.uuid, "no MIG device has this UUID")
        return any(self._processes(card, mig) for _, _, mig in devices)

    def _processes(self, card: int, mig: api.Handle) -> int:
        count = ctypes.c_uint(0)
        try:
            call(self._api.hgmlDeviceGetComputeRunningProcesses, mig, ctypes.byref(count), None)
        except CallFailed as exc:
            if exc.code == ERROR_INSUFFICIENT_SIZE:
                return max(count.value, 1)
            raise ReadError("busy", card, None, f"listing the processes: {exc}") from exc
        return count.value

    # -- partkeeper probe ---------------------------------------------------------------------

    def probe_view(self, card: int) -> dict[str, Any]:
        """MIG mode, and the profiles with the library's ids, probe indices and placements beside
        the tables (read-only)."""
        dev = self._device("probe", card)
        current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
        try:
            call(self._api.hgmlDeviceGetMigMode, dev, ctypes.byref(current), ctypes.byref(pending))
        except CallFailed as exc:
            if exc.code != ERROR_NOT_SUPPORTED:
                raise ReadError("probe", card, None, f"reading the MIG mode: {exc}") from exc
            return {"mig": None, "profiles": []}
        view: dict[str, Any] = {
            "mig": {
                "current": current.value == api.MIG_ENABLE,
                "pending": pending.value == api.MIG_ENABLE,
            },
            "profiles": [],
        }
        if current.value == api.MIG_ENABLE:
            info = self._card_info("probe", card, dev)
            view["profiles"] = [
                vendor.profile_view(
                    p.name, p.id, None, p.count, p.placements, info.model, p.offered
                )
                for p in info.gi_profiles
            ]
        return view

    # -- what a container gets ----------------------------------------------------------------

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits:
        inst = vendor.one_partition(instances, "T-Head PPU")
        dev = self._device("allocate", inst.card)
        minor = self._card_info("allocate", inst.card, dev).minor
        return thead_nodes.edits(self.root, self.proc_root, inst, minor)

    def card_edits(self, cards: Sequence[Card]) -> ContainerEdits:
        """The control nodes and each PPU's node, its minor checked against HGML's: as T-Head's
        device plugin hands whole cards, any number to one container (the one-partition rule is
        the MIG runtime's, and no partition is handed over here)."""
        op = "allocate"
        found = [(c.index, self._minor(op, c.index, self._device(op, c.index))) for c in cards]
        return thead_nodes.card_edits(self.root, found)


def _instance(
    card: int, gi_id: int, label: str, start: int, size: int, devices: list[_Mig]
) -> Instance:
    # A GI without a CI (an interrupted create or destroy, or carved by hand) still occupies its
    # slices: listed with CI id -1 and no UUID rather than left out.
    ci_id, uuid = (devices[0][0], devices[0][1]) if devices else (-1, "")
    return Instance(card, label, start, size, gi_id, ci_id, uuid)
