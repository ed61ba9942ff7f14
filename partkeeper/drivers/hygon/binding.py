"""The `dmi` driver: Hygon DCU partitions through libhydmi_mig.so.1 (ctypes; see api.py).

The algorithm is partkeeper/drivers/mig.py; the library differs from NVML where this says:
- MIG mode is node-wide (`nvmlGetSystemMigMode`): every card is in partition mode or none is.
- A card is addressed by its domain-qualified PCI bus id from the registry (`dev<N>`); its UUID is
  `GPU-` + the unique id ROCm SMI reports, because the library has no UUID call.
- Profiles are queried by slice count minus one (the answer carries the id); the whole-GI compute
  profile likewise. There is no GPU-instance lookup by id: destroy finds it in the listing.
- A partition's identity is `MIG-` + the `mig_uuid:` of its registry record, issued afresh on every
  create, even at the same placement: a successor never reproduces its predecessor's identity.
- There is no per-partition process query: `is_busy` cannot answer (ReadError, so nothing is
  reaped on a guess); busy is known only when a destroy says IN_USE.
- The container gets device nodes, the runtime, its record and one env variable (host.py); one
  partition per container. Whole cards (mode off: logical slices) get the nodes and the runtime
  only, any number per container.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from partkeeper.drivers import clib, mig, vendor
from partkeeper.drivers.base import (
    Card,
    ContainerEdits,
    Instance,
    Mode,
    ReadError,
    UnknownError,
    issued_identity,
)
from partkeeper.drivers.hygon import api, catalogue, host


class DmiBinding(mig.Binding):
    """DMI through ctypes: the library and the host root its registry is read under."""

    library = "DMI"
    node_wide_mode = True

    def __init__(self, root: Path, paths: list[str] | None) -> None:
        self.api = clib.load("Hygon DMI", api.load, paths)
        self.root = root

    def count(self) -> int:
        return clib.read_uint("list", None, "counting devices", self.api.nvmlDeviceGetCount)

    def device(self, op: str, card: int) -> int:
        """The card's handle, reached by its PCI bus id and checked to be card `card`."""
        pci = host.pci_bus_id(self.root, card)
        dev = ctypes.c_void_p()
        clib.read_call(op, card, f"getting the handle of {pci}",
                       self.api.nvmlDeviceGetHandleByPciBusId, pci.encode(), ctypes.byref(dev))
        index = clib.read_uint(op, card, "reading the device index", self.api.nvmlDeviceGetIndex,
                               dev)
        if index != card:
            cause = f"{pci} (registry dev{card}) is the library's device {index}"
            raise ReadError(op, card, None, cause)
        return dev.value or 0

    def mig_modes(self, op: str, card: int, dev: Any) -> tuple[bool, bool] | None:
        current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
        clib.read_call(op, None, "reading the node's MIG mode", self.api.nvmlGetSystemMigMode,
                       ctypes.byref(current), ctypes.byref(pending))
        return (current.value == api.MIG_ENABLE, pending.value == api.MIG_ENABLE)

    def card(self, op: str, index: int, dev: Any, catalogue: Callable[[], mig.Catalogue]) -> Card:
        modes = self.mig_modes(op, index, dev)
        mode: Mode = "partition" if modes and modes[0] else "sliced"
        mib = clib.memory_mib(op, index, self.api.nvmlDeviceGetMemoryInfo, dev)
        model = vendor.model_for("hygon", mib) or f"Hygon DCU {mib} MiB"
        uuid = host.card_uuid(self.root, index, host.pci_bus_id(self.root, index))
        return Card(index, uuid, model, mode, mib)

    def catalogue(self, op: str, card: int, dev: int) -> mig.Catalogue:
        mib = clib.memory_mib(op, card, self.api.nvmlDeviceGetMemoryInfo, dev)
        model = vendor.model_for("hygon", mib)
        return mig.Catalogue(model, catalogue.probe(self.api, op, card, dev, model))

    # -- instances ----------------------------------------------------------------------------

    def gpu_instances(self, op: str, card: int, dev: Any, profile: mig.GiProfile) -> list[mig.Gi]:
        handles = clib.read_handles(op, card, f"listing {profile.name} GPU instances",
                                    self.api.nvmlDeviceGetGpuInstances, ctypes.c_void_p, dev,
                                    profile.id)
        found = []
        for handle in handles:
            info = clib.read_struct(op, card, "reading a GPU instance",
                                    self.api.nvmlGpuInstanceGetInfo, handle, api.GpuInstanceInfo)
            found.append(mig.Gi(handle or 0, info.id, profile.id, info.placement.start,
                                info.placement.size, profile.slices))
        return found

    def gpu_instance(
        self, op: str, card: int, dev: Any, gi_id: int, catalogue: Callable[[], mig.Catalogue]
    ) -> mig.Gi:
        """DMI has no lookup by id: the GI is found in the listing of every profile."""
        for profile in catalogue().profiles:
            for gi in self.gpu_instances(op, card, dev, profile):
                if gi.gi_id == gi_id:
                    return gi
        raise mig.NoGpuInstance(f"no profile lists GPU instance {gi_id}")

    def compute_instances(
        self, op: str, card: int, dev: Any, gis: Sequence[mig.Gi]
    ) -> dict[int, list[mig.Ci]]:
        """The whole-GI CIs of each of `gis`, the first with its registry identity."""
        found: dict[int, list[mig.Ci]] = {}
        for gi in gis:
            cis = self._cis(op, card, gi)
            if cis:
                uuid = host.read_uuid(self.root, (card, gi.gi_id, cis[0].ci_id), op)
                cis[0] = mig.Ci(cis[0].ci_id, uuid, handle=cis[0].handle)
            found[gi.gi_id] = cis
        return found

    def _cis(self, op: str, card: int, gi: mig.Gi) -> list[mig.Ci]:
        profile = catalogue.compute_profile(self.api, op, card, gi.handle, gi.slices)
        if profile is None:
            return []
        handles = clib.read_handles(op, card, "listing compute instances",
                                    self.api.nvmlGpuInstanceGetComputeInstances, ctypes.c_void_p,
                                    gi.handle, profile)
        found = []
        for handle in handles:
            info = clib.read_struct(op, card, "reading a compute instance",
                                    self.api.nvmlComputeInstanceGetInfo, handle,
                                    api.ComputeInstanceInfo)
            found.append(mig.Ci(info.id, "", handle=handle or 0))
        return sorted(found, key=lambda c: c.ci_id)

    def counts_processes(self) -> bool:
        return False  # no per-partition process query in the library

    def leftovers(self) -> list[str]:
        """Directories squatting on registry records (each makes its ids' creates fail)."""
        return host.leftovers(self.root)

    def remove_leftover(self, record: str) -> None:
        host.remove_leftover(self.root, record)

    # -- changes ------------------------------------------------------------------------------

    def create_gi(self, card: int, dev: Any, profile: mig.GiProfile, start: int, size: int) -> Any:
        gi = ctypes.c_void_p()
        clib.change_call("create", card, None, f"creating a {profile.name} GPU instance at {start}",
                         self.api.nvmlDeviceCreateGpuInstanceWithPlacement, dev, profile.id,
                         ctypes.byref(api.Placement(start, size)), ctypes.byref(gi))
        return gi.value or 0

    def gi_id(self, card: int, gi: Any) -> int:
        info = api.GpuInstanceInfo()
        clib.create_step(card, self.api.nvmlGpuInstanceGetInfo, gi, ctypes.byref(info))
        return int(info.id)

    def create_ci(self, card: int, gi: mig.Gi, profile: mig.GiProfile) -> Any:
        ci_profile = catalogue.compute_profile(self.api, "create", card, gi.handle, profile.slices)
        if ci_profile is None:
            raise UnknownError("create", card, None, "no whole-GI compute profile")
        made = ctypes.c_void_p()
        try:
            clib.call(self.api.nvmlGpuInstanceCreateComputeInstance, gi.handle, ci_profile,
                      ctypes.byref(made))
        except clib.CallFailed as exc:
            raise self._squatted(card, gi.gi_id, exc) from exc
        return made.value or 0

    def _squatted(self, card: int, gi_id: int, exc: clib.CallFailed) -> UnknownError:
        """Name the directory that makes a create fail forever, when that is the cause."""
        record = host.conf_record(card, gi_id, 0)
        if exc.code == clib.ERROR_INSUFFICIENT_RESOURCES and record in host.leftovers(self.root):
            cause = (f"a directory sits at the partition record {record} (left by a container "
                     "runtime); the reclaimer removes it, then the create can succeed")
            return UnknownError("create", card, None, cause)
        return UnknownError("create", card, None, str(exc))

    def new_ci(self, card: int, gi: mig.Gi, handle: Any) -> mig.Ci:
        """The new CI and the identity the library issued it, read from its registry record."""
        info = api.ComputeInstanceInfo()
        clib.create_step(card, self.api.nvmlComputeInstanceGetInfo, handle, ctypes.byref(info))
        uuid = host.read_uuid(self.root, (card, gi.gi_id, info.id), "create")
        return mig.Ci(info.id, uuid, handle=handle)

    def destroy_ci(self, op: str, card: int, gi: mig.Gi, ci: mig.Ci) -> None:
        clib.change_call(op, card, ci.uuid or None, f"destroying compute instance {ci.ci_id}",
                         self.api.nvmlComputeInstanceDestroy, ci.handle)

    def destroy_gi(self, op: str, card: int, name: str, gi: mig.Gi) -> None:
        clib.change_call(op, card, name, f"destroying GPU instance {gi.gi_id}",
                         self.api.nvmlGpuInstanceDestroy, gi.handle)

    # -- what a container gets ----------------------------------------------------------------

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits:
        inst = vendor.one_partition(instances, "Hygon DCU")
        return host.edits(self.root, inst, host.pci_bus_id(self.root, inst.card))

    def card_edits(self, cards: Sequence[Card]) -> ContainerEdits:
        """Each card's DRM nodes (found through its registry PCI id), the shared nodes and
        /opt/hyhal; any number of cards to one container, as Hygon's device plugin hands whole
        cards (the one-partition rule is about `DMI_MIG_VISIBLE_DEVICE`, not set here)."""
        found = [(c.index, host.pci_bus_id(self.root, c.index)) for c in cards]
        return host.card_edits(self.root, found)


class DmiDriver(mig.MigDriver):
    """The Driver protocol over DMI."""

    name = "dmi"
    same_partition = staticmethod(issued_identity)

    def __init__(self, *, root: Path = Path("/"), paths: list[str] | None = None) -> None:
        self.binding = DmiBinding(root, paths)
        super().__init__(self.binding)

    @property
    def library_path(self) -> str:
        return self.binding.api.lib.path
