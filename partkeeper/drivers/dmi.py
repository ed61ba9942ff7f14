"""The `dmi` driver: Hygon DCU partitions through libhydmi_mig.so.1 (ctypes; see dmi_api.py).

The model differs from NVIDIA's where the library does:
- MIG mode is node-wide (`nvmlGetSystemMigMode`): every card is in partition mode or none is.
- A card is addressed by its domain-qualified PCI bus id from the registry (`dev<N>`); its UUID is
  `GPU-` + the unique id ROCm SMI reports, because the library has no UUID call.
- Profiles are queried by slice count minus one (the answer carries the id); the whole-GI compute
  profile likewise.
- A partition's identity is `MIG-` + the `mig_uuid:` of its registry record, issued afresh on every
  create, even at the same placement: a successor never reproduces its predecessor's identity.
- There is no per-partition process query: `is_busy` cannot answer (ReadError, so nothing is
  reaped on a guess); busy is known only when a destroy says IN_USE.
- The container gets device nodes, the runtime, its record and one env variable (hygon_host.py);
  one partition per container. Whole cards (mode off: logical slices) get the nodes and the
  runtime only, any number per container.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partkeeper.drivers import dmi_api as api
from partkeeper.drivers import dmi_profiles, hygon_host, vendor
from partkeeper.drivers.base import (
    Card,
    ContainerEdits,
    DriverError,
    Instance,
    InstanceSpec,
    LibraryMissing,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
    identity_mismatch,
    issued_identity,
)
from partkeeper.drivers.clib import (
    ERROR_INSUFFICIENT_RESOURCES,
    CallFailed,
    call,
    change_call,
    read_call,
)
from partkeeper.drivers.dmi_profiles import Profile


@dataclass(frozen=True, slots=True)
class _Gi:
    handle: int
    gi_id: int
    profile: Profile
    start: int
    size: int


class DmiDriver:
    """The Driver protocol over DMI. Holds the library and static card facts only."""

    name = "dmi"
    same_partition = staticmethod(issued_identity)

    def __init__(self, *, root: Path = Path("/"), paths: list[str] | None = None) -> None:
        try:
            self._api = api.load(paths)
        except (LibraryMissing, AttributeError) as exc:
            raise LibraryMissing(f"Hygon DMI: {exc}; install the vendor's driver and SDK on the "
                                 "node, or set PK_DRIVER=sim") from exc
        self.root = root
        self._profiles: dict[int, tuple[Profile, ...]] = {}

    @property
    def library_path(self) -> str:
        return self._api.lib.path

    # -- calls with their errors mapped -------------------------------------------------------

    _read = staticmethod(read_call)
    _change = staticmethod(change_call)

    def _uint(self, op: str, card: int | None, what: str, fn: Any, *args: Any) -> int:
        out = ctypes.c_uint(0)
        self._read(op, card, what, fn, *args, ctypes.byref(out))
        return out.value

    def _mig_enabled(self, op: str) -> bool:
        current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
        self._read(
            op,
            None,
            "reading the node's MIG mode",
            self._api.nvmlGetSystemMigMode,
            ctypes.byref(current),
            ctypes.byref(pending),
        )
        return current.value == api.MIG_ENABLE

    def _device(self, op: str, card: int) -> tuple[int, str]:
        """The card's handle, reached by its PCI bus id and checked to be card `card`."""
        pci = hygon_host.pci_bus_id(self.root, card)
        dev = ctypes.c_void_p()
        self._read(
            op,
            card,
            f"getting the handle of {pci}",
            self._api.nvmlDeviceGetHandleByPciBusId,
            pci.encode(),
            ctypes.byref(dev),
        )
        index = self._uint(op, card, "reading the device index", self._api.nvmlDeviceGetIndex, dev)
        if index != card:
            cause = f"{pci} (registry dev{card}) is the library's device {index}"
            raise ReadError(op, card, None, cause)
        return dev.value or 0, pci

    # -- static card facts --------------------------------------------------------------------

    def _card_profiles(self, op: str, card: int, dev: int) -> tuple[Profile, ...]:
        """Cached once non-empty: profiles change only with the mode (partkeeper restarts)."""
        if card not in self._profiles:
            found = dmi_profiles.probe(self._api, op, card, dev)
            if not found:
                return found
            self._profiles[card] = found
        return self._profiles[card]

    def _compute_profile(self, op: str, card: int, gi: int, slices: int) -> int | None:
        return dmi_profiles.compute_profile(self._api, op, card, gi, slices)

    # -- enumeration --------------------------------------------------------------------------

    def cards(self) -> list[Card]:
        count = self._uint("list", None, "counting devices", self._api.nvmlDeviceGetCount)
        mode = "partition" if self._mig_enabled("list") else "sliced"
        return [self._card(index, mode) for index in range(count)]

    def _card(self, index: int, mode: str) -> Card:
        dev, pci = self._device("list", index)
        memory = api.Memory()
        self._read(
            "list",
            index,
            "reading the memory",
            self._api.nvmlDeviceGetMemoryInfo,
            dev,
            ctypes.byref(memory),
        )
        memory_mib = int(memory.total // 2**20)
        model = vendor.model_for("hygon", memory_mib) or f"Hygon DCU {memory_mib} MiB"
        uuid = hygon_host.card_uuid(self.root, index, pci)
        return Card(index, uuid, model, mode, memory_mib)  # type: ignore[arg-type]

    def instances(self, card: int) -> list[Instance]:
        if not self._mig_enabled("list"):
            return []
        dev, _ = self._device("list", card)
        return [
            self._describe("list", card, gi)[0] for gi in self._gpu_instances("list", card, dev)
        ]

    def _gpu_instances(self, op: str, card: int, dev: int) -> list[_Gi]:
        found: list[_Gi] = []
        for prof in self._card_profiles(op, card, dev):
            array = (ctypes.c_void_p * api.MAX_INSTANCES)()
            count = ctypes.c_uint(api.MAX_INSTANCES)
            self._read(
                op,
                card,
                f"listing {prof.name} GPU instances",
                self._api.nvmlDeviceGetGpuInstances,
                dev,
                prof.id,
                array,
                ctypes.byref(count),
            )
            for handle in array[: count.value]:
                info = api.GpuInstanceInfo()
                self._read(
                    op,
                    card,
                    "reading a GPU instance",
                    self._api.nvmlGpuInstanceGetInfo,
                    handle,
                    ctypes.byref(info),
                )
                found.append(
                    _Gi(handle or 0, info.id, prof, info.placement.start, info.placement.size)
                )
        return sorted(found, key=lambda g: g.start)

    def _compute_instances(self, op: str, card: int, gi: _Gi) -> list[tuple[int, int]]:
        """The whole-GI compute instances of `gi` as (handle, CI id)."""
        profile = self._compute_profile(op, card, gi.handle, gi.profile.slices)
        if profile is None:
            return []
        array = (ctypes.c_void_p * api.MAX_INSTANCES)()
        count = ctypes.c_uint(api.MAX_INSTANCES)
        self._read(
            op,
            card,
            "listing compute instances",
            self._api.nvmlGpuInstanceGetComputeInstances,
            gi.handle,
            profile,
            array,
            ctypes.byref(count),
        )
        found = []
        for handle in array[: count.value]:
            info = api.ComputeInstanceInfo()
            self._read(
                op,
                card,
                "reading a compute instance",
                self._api.nvmlComputeInstanceGetInfo,
                handle,
                ctypes.byref(info),
            )
            found.append((handle or 0, info.id))
        return sorted(found, key=lambda c: c[1])

    def _describe(self, op: str, card: int, gi: _Gi) -> tuple[Instance, list[tuple[int, int]]]:
        cis = self._compute_instances(op, card, gi)
        # A GI without a CI (an interrupted create or destroy) still occupies its slices.
        ci_id = cis[0][1] if cis else -1
        uuid = hygon_host.read_uuid(self.root, (card, gi.gi_id, ci_id), op) if cis else ""
        return Instance(card, gi.profile.name, gi.start, gi.size, gi.gi_id, ci_id, uuid), cis

    # -- changes ------------------------------------------------------------------------------

    def create(self, spec: InstanceSpec) -> Instance:
        op, card = "create", spec.card
        if not self._mig_enabled(op):
            raise PlacementError(op, card, None, "the node's MIG mode is not enabled")
        dev, _ = self._device(op, card)
        profs = self._card_profiles(op, card, dev)
        chosen = next((p for p in profs if p.name == spec.profile), None)
        model = vendor.model_for("hygon", self._card(card, "partition").memory_mib)
        ours = vendor.legal_shape(
            spec, model, [p.name for p in profs], chosen.placements if chosen else ()
        )
        assert chosen is not None
        existing = self.instances(card)
        leftover = vendor.leftover_at(spec, existing)
        if leftover is not None:
            gis = self._gpu_instances(op, card, dev)
            handle = next(g.handle for g in gis if g.gi_id == leftover.gi_id)
            return self._complete(spec, chosen, handle)
        vendor.refuse_overlap(spec, ours.size, existing)
        gi = ctypes.c_void_p()
        self._change(
            op,
            card,
            None,
            f"creating a {spec.profile} GPU instance at {spec.start}",
            self._api.nvmlDeviceCreateGpuInstanceWithPlacement,
            dev,
            chosen.id,
            ctypes.byref(api.Placement(spec.start, ours.size)),
            ctypes.byref(gi),
        )
        return self._complete(spec, chosen, gi.value or 0)

    def _complete(self, spec: InstanceSpec, chosen: Profile, gi: int) -> Instance:
        """The whole-GI CI and the identity the driver issued; on failure, undo what was made."""
        ci: int | None = None
        step = "reading the new GPU instance"
        try:
            info = api.GpuInstanceInfo()
            call(self._api.nvmlGpuInstanceGetInfo, gi, ctypes.byref(info))
            step = "choosing its compute profile"
            profile = self._compute_profile("create", spec.card, gi, chosen.slices)
            if profile is None:
                raise UnknownError("create", spec.card, None, "no whole-GI compute profile")
            step = "creating its compute instance"
            made = ctypes.c_void_p()
            try:
                call(
                    self._api.nvmlGpuInstanceCreateComputeInstance, gi, profile, ctypes.byref(made)
                )
            except CallFailed as exc:
                raise self._squatted(spec, info.id, exc) from exc
            ci = made.value or 0
            ci_info = api.ComputeInstanceInfo()
            call(self._api.nvmlComputeInstanceGetInfo, ci, ctypes.byref(ci_info))
            step = "reading its identity"
            uuid = hygon_host.read_uuid(self.root, (spec.card, info.id, ci_info.id), "create")
        except (CallFailed, DriverError) as exc:
            detail = exc.cause if isinstance(exc, DriverError) else str(exc)
            raise self._undo(spec, gi, ci, f"{step} failed ({detail})") from exc
        return Instance(
            spec.card, spec.profile, spec.start, info.placement.size, info.id, ci_info.id, uuid
        )

    def _squatted(self, spec: InstanceSpec, gi_id: int, exc: CallFailed) -> Exception:
        """Name the directory that makes a create fail forever, when that is the cause."""
        record = hygon_host.conf_record(spec.card, gi_id, 0)
        if exc.code == ERROR_INSUFFICIENT_RESOURCES and record in hygon_host.leftovers(self.root):
            cause = (
                f"a directory sits at the partition record {record} (left by a container "
                "runtime); the reclaimer removes it, then the create can succeed"
            )
            return UnknownError("create", spec.card, None, cause)
        return exc

    def _undo(self, spec: InstanceSpec, gi: int, ci: int | None, cause: str) -> UnknownError:
        destroy_ci = (None if ci is None
                      else functools.partial(call, self._api.nvmlComputeInstanceDestroy, ci))
        return vendor.undo_create(spec, cause, destroy_ci,
                                  functools.partial(call, self._api.nvmlGpuInstanceDestroy, gi))

    def destroy(self, expected: Instance) -> None:
        op, card = "destroy", expected.card
        name = expected.uuid or f"GI {expected.gi_id}"
        dev, _ = self._device(op, card)
        gi = next(
            (g for g in self._gpu_instances(op, card, dev) if g.gi_id == expected.gi_id), None
        )
        if gi is None:
            raise NotFoundError(op, card, name, f"no GPU instance {expected.gi_id} exists")
        found, cis = self._describe(op, card, gi)
        if not self.same_partition(expected, found):
            raise identity_mismatch(expected, found)
        for handle, ci_id in cis:
            self._change(
                op,
                card,
                found.uuid,
                f"destroying compute instance {ci_id}",
                self._api.nvmlComputeInstanceDestroy,
                handle,
            )
        self._change(
            op,
            card,
            name,
            f"destroying GPU instance {expected.gi_id}",
            self._api.nvmlGpuInstanceDestroy,
            gi.handle,
        )

    def is_busy(self, instance: Instance) -> bool:
        cause = (
            "the Hygon library has no per-partition process query; whether the partition "
            "is in use is unknown until a destroy says IN_USE"
        )
        raise ReadError("busy", instance.card, instance.uuid or None, cause)

    # -- partkeeper probe ---------------------------------------------------------------------

    def probe_view(self, card: int) -> dict[str, Any]:
        """The node-wide MIG mode, and the card's profiles with the library's ids, the slice index
        they were asked by and their placements beside the tables (read-only)."""
        current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
        self._read(
            "probe",
            None,
            "reading the node's MIG mode",
            self._api.nvmlGetSystemMigMode,
            ctypes.byref(current),
            ctypes.byref(pending),
        )
        view: dict[str, Any] = {
            "mig": {
                "current": current.value == api.MIG_ENABLE,
                "pending": pending.value == api.MIG_ENABLE,
                "node_wide": True,
            },
            "profiles": [],
        }
        if current.value == api.MIG_ENABLE:
            dev, _ = self._device("probe", card)
            model = self._card(card, "partition").model
            view["profiles"] = [
                vendor.profile_view(
                    p.name, p.id, p.slices - 1, len(p.placements), p.placements, model, True
                )
                for p in self._card_profiles("probe", card, dev)
            ]
        return view

    # -- registry leftovers and what a container gets -----------------------------------------

    def leftovers(self) -> list[str]:
        """Directories squatting on registry records (each makes its ids' creates fail)."""
        return hygon_host.leftovers(self.root)

    def remove_leftover(self, record: str) -> None:
        hygon_host.remove_leftover(self.root, record)

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits:
        inst = vendor.one_partition(instances, "Hygon DCU")
        return hygon_host.edits(self.root, inst, hygon_host.pci_bus_id(self.root, inst.card))

    def card_edits(self, cards: Sequence[Card]) -> ContainerEdits:
        """Each card's DRM nodes (found through its registry PCI id), the shared nodes and
        /opt/hyhal; any number of cards to one container, as Hygon's device plugin hands whole
        cards (the one-partition rule is about `DMI_MIG_VISIBLE_DEVICE`, not set here)."""
        found = [(c.index, hygon_host.pci_bus_id(self.root, c.index)) for c in cards]
        return hygon_host.card_edits(self.root, found)
