"""The `hgml` driver: T-Head PPU partitions through libhgml.so (ctypes; see api.py).

HGML is NVML-shaped, so the model is NVIDIA's: a partition is one GPU instance (GI) with one
compute instance (CI) spanning it; ids are per card; the partition's identity is the MIG device
UUID the library reports for the CI, and (as NVIDIA's) a successor at the same slot may reproduce
it, which is why only claims tell them apart. What differs: profiles are found by probing indices
0..84 (an index is not the profile id) and matched by normalised name (catalogue.py); the new
CI's UUID is found by a walk; the container gets device nodes, not an environment variable
(nodes.py). The algorithm is partkeeper/drivers/mig.py.
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
    LibraryMissing,
    Mode,
    ReadError,
    slot_identity,
)
from partkeeper.drivers.thead import api, catalogue, nodes

# INSUFFICIENT_RESOURCES from a create: the placement is taken (HGML answers as NVML does).
_CREATE_PLACEMENT = frozenset({clib.ERROR_INSUFFICIENT_RESOURCES})


class HgmlBinding(mig.Binding):
    """HGML through ctypes: the library and where the host's nodes and procfs records are."""

    library = "HGML"

    def __init__(self, root: Path, proc_root: Path | None, paths: list[str] | None) -> None:
        self.api = clib.load("T-Head HGML", api.load, paths)
        self.root = root  # where the driver's /dev lives on the host (PK_DRIVER_ROOT)
        self.proc_root = proc_root or root / "proc"  # where /proc/driver/alixpu is read
        try:
            clib.call(self.api.Init)
        except clib.CallFailed as exc:
            raise LibraryMissing(f"T-Head HGML ({self.api.lib.path}) cannot be initialised "
                                 f"({exc}); is the PPU driver loaded?") from exc

    def close(self) -> None:
        clib.read_call("close", None, "shutting HGML down", self.api.hgmlShutdown)

    def _string(self, op: str, card: int, what: str, fn: Any, dev: api.Handle) -> str:
        buf = ctypes.create_string_buffer(api.UUID_SIZE)
        clib.read_call(op, card, what, fn, dev, buf, api.UUID_SIZE)
        return clib.text(buf.raw)

    def minor(self, op: str, card: int, dev: api.Handle) -> int:
        """The PPU node's kernel minor, as HGML reports it (`/dev/alixpu_ppu<ordinal>` must have
        it)."""
        return clib.read_uint(op, card, "reading the minor number",
                          self.api.hgmlDeviceGetMinorNumber, dev)

    def count(self) -> int:
        return clib.read_uint("list", None, "counting devices", self.api.DeviceGetCount)

    def device(self, op: str, card: int) -> api.Handle:
        dev = api.Handle()
        clib.read_call(op, card, "getting the device handle", self.api.DeviceGetHandleByIndex, card,
                       ctypes.byref(dev))
        return dev

    def mig_modes(self, op: str, card: int, dev: api.Handle) -> tuple[bool, bool] | None:
        current, pending = ctypes.c_uint(0), ctypes.c_uint(0)
        try:
            clib.call(self.api.hgmlDeviceGetMigMode, dev, ctypes.byref(current),
                      ctypes.byref(pending))
        except clib.CallFailed as exc:
            if exc.code == clib.ERROR_NOT_SUPPORTED:
                return None  # a PPU without MIG is sliced
            raise ReadError(op, card, None, f"reading the MIG mode: {exc}") from exc
        return (current.value == api.MIG_ENABLE, pending.value == api.MIG_ENABLE)

    def card(self, op: str, index: int, dev: Any, catalogue: Callable[[], mig.Catalogue]) -> Card:
        a = self.api
        name = self._string(op, index, "reading the name", a.hgmlDeviceGetName, dev)
        uuid = self._string(op, index, "reading the UUID", a.hgmlDeviceGetUUID, dev)
        modes = self.mig_modes(op, index, dev)
        mode: Mode = "partition" if modes is not None and modes[0] else "sliced"
        mib = clib.memory_mib(op, index, self.api.hgmlDeviceGetMemoryInfo, dev)
        model = vendor.model_for("thead", mib)
        minor = self.minor(op, index, dev)
        return Card(index, uuid, model or name, mode, mib, minor=minor)

    def catalogue(self, op: str, card: int, dev: api.Handle) -> mig.Catalogue:
        mib = clib.memory_mib(op, card, self.api.hgmlDeviceGetMemoryInfo, dev)
        model = vendor.model_for("thead", mib)
        return mig.Catalogue(model, catalogue.probe(self.api, op, card, dev, model))

    # -- instances ----------------------------------------------------------------------------

    def gpu_instances(self, op: str, card: int, dev: Any, profile: mig.GiProfile) -> list[mig.Gi]:
        handles = clib.read_handles(op, card, f"listing {profile.name} GPU instances",
                                    self.api.hgmlDeviceGetGpuInstances, api.Handle, dev, profile.id)
        return [self._describe(op, card, h) for h in handles]

    def _describe(self, op: str, card: int, handle: api.Handle) -> mig.Gi:
        info = clib.read_struct(op, card, "reading a GPU instance", self.api.hgmlGpuInstanceGetInfo,
                                handle, api.GpuInstanceInfo)
        return mig.Gi(handle, info.id, info.profileId, info.placement.start, info.placement.size)

    def gpu_instance(
        self, op: str, card: int, dev: Any, gi_id: int, catalogue: Callable[[], mig.Catalogue]
    ) -> mig.Gi:
        handle = api.Handle()
        what = f"looking up GPU instance {gi_id}"
        if not clib.found(op, card, what, self.api.hgmlDeviceGetGpuInstanceById, dev, gi_id,
                          ctypes.byref(handle)):
            raise mig.NoGpuInstance(f"{what}: HGML answers NOT_FOUND")
        return self._describe(op, card, handle)

    def compute_instances(
        self, op: str, card: int, dev: Any, gis: Sequence[mig.Gi]
    ) -> dict[int, list[mig.Ci]]:
        """One walk of the MIG devices (one per CI), as NVML's."""
        total = clib.read_uint(op, card, "counting MIG devices",
                               self.api.hgmlDeviceGetMaxMigDeviceCount, dev)
        return mig.walk(total, lambda index: self._mig_at(op, card, dev, index),
                        lambda mig: self._mig_ids(op, card, mig))

    def _mig_at(self, op: str, card: int, dev: Any, index: int) -> api.Handle | None:
        mig = api.Handle()
        if not clib.found(op, card, f"reading MIG device {index}",
                          self.api.hgmlDeviceGetMigDeviceHandleByIndex, dev, index,
                          ctypes.byref(mig)):
            return None  # no MIG device at this index
        return mig

    def _mig_ids(self, op: str, card: int, mig: api.Handle) -> tuple[int, int, str]:
        a = self.api
        return (clib.read_uint(op, card, "reading a GI id", a.hgmlDeviceGetGpuInstanceId, mig),
                clib.read_uint(op, card, "reading a CI id", a.hgmlDeviceGetComputeInstanceId, mig),
                self._string(op, card, "reading a MIG UUID", a.hgmlDeviceGetUUID, mig))

    def processes(self, op: str, card: int, ci: mig.Ci) -> int:
        count = ctypes.c_uint(0)
        try:
            clib.call(self.api.hgmlDeviceGetComputeRunningProcesses, ci.device, ctypes.byref(count),
                      None)
        except clib.CallFailed as exc:
            if exc.code == clib.ERROR_INSUFFICIENT_SIZE:  # NULL buffer: the count is the answer
                return max(count.value, 1)
            raise ReadError(op, card, None, f"listing the processes: {exc}") from exc
        return count.value

    # -- changes ------------------------------------------------------------------------------

    def create_gi(self, card: int, dev: Any, profile: mig.GiProfile, start: int, size: int) -> Any:
        gi = api.Handle()
        what = f"creating a {profile.name} GPU instance at start {start}"
        clib.change_call("create", card, None, what,
                         self.api.hgmlDeviceCreateGpuInstanceWithPlacement, dev, profile.id,
                         ctypes.byref(api.Placement(start, size)), ctypes.byref(gi),
                         placement_codes=_CREATE_PLACEMENT)
        return gi

    def gi_id(self, card: int, gi: Any) -> int:
        info = api.GpuInstanceInfo()
        clib.create_step(card, self.api.hgmlGpuInstanceGetInfo, gi, ctypes.byref(info))
        return int(info.id)

    def create_ci(self, card: int, gi: mig.Gi, profile: mig.GiProfile) -> Any:
        ci_profile = catalogue.whole_compute_profile(self.api, card, gi.handle, profile)
        made = api.Handle()
        clib.create_step(card, self.api.hgmlGpuInstanceCreateComputeInstance, gi.handle, ci_profile,
                   ctypes.byref(made))
        return made

    def new_ci(self, card: int, gi: mig.Gi, handle: Any) -> mig.Ci:
        info = api.ComputeInstanceInfo()
        clib.create_step(card, self.api.ComputeInstanceGetInfo, handle, ctypes.byref(info))
        return mig.Ci(info.id, "", handle=handle)  # the UUID: one walk

    def destroy_ci(self, op: str, card: int, gi: mig.Gi, ci: mig.Ci) -> None:
        handle = ci.handle
        if handle is None:
            handle = api.Handle()
            if not clib.found(op, card, f"looking up compute instance {ci.ci_id}",
                              self.api.hgmlGpuInstanceGetComputeInstanceById, gi.handle, ci.ci_id,
                              ctypes.byref(handle), name=ci.uuid or None):
                return  # the CI is already gone; the GI still has to go
        clib.change_call(op, card, ci.uuid or None, f"destroying compute instance {ci.ci_id}",
                         self.api.hgmlComputeInstanceDestroy, handle)

    def destroy_gi(self, op: str, card: int, name: str, gi: mig.Gi) -> None:
        clib.change_call(op, card, name, f"destroying GPU instance {gi.gi_id}",
                         self.api.hgmlGpuInstanceDestroy, gi.handle)

    # -- what a container gets ----------------------------------------------------------------

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits:
        inst = vendor.one_partition(instances, "T-Head PPU")
        minor = self.minor("allocate", inst.card, self.device("allocate", inst.card))
        return nodes.edits(self.root, self.proc_root, inst, minor)

    def card_edits(self, cards: Sequence[Card]) -> ContainerEdits:
        """The control nodes and each PPU's node, its minor checked against HGML's: as T-Head's
        device plugin hands whole cards, any number to one container (the one-partition rule is
        the MIG runtime's, and no partition is handed over here)."""
        op = "allocate"
        found = [(c.index, self.minor(op, c.index, self.device(op, c.index))) for c in cards]
        return nodes.card_edits(self.root, found)


class HgmlDriver(mig.MigDriver):
    """The Driver protocol over HGML."""

    name = "hgml"
    same_partition = staticmethod(slot_identity)

    def __init__(
        self, *, root: Path = Path("/"), proc_root: Path | None = None,
        paths: list[str] | None = None,
    ) -> None:
        self.binding = HgmlBinding(root, proc_root, paths)
        super().__init__(self.binding)

    @property
    def library_path(self) -> str:
        return self.binding.api.lib.path
