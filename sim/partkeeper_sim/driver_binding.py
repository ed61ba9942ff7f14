"""The simulated cards as a MIG library: a `mig.Binding` over one transaction's state.

The simulator runs the one MIG algorithm every real node runs (partkeeper/drivers/mig.py): listing,
create with its leftover and overlap checks, completing a half-made GPU instance, the undo of a
failed create, destroy with its identity check, the busy check. This binding only says what the
"library" answers, reading and changing the `SimState` that the driver's transaction holds
locked (driver.py), so one operation of the algorithm is one transaction of the state file.

What a library does that the simulator models here:
- a GPU instance (GI) is created without compute instance (CI), at the lowest free GI id, and
  refused where its slices are taken (NVML's INSUFFICIENT_RESOURCES);
- the CI's UUID is its vendor's (driver_state.instance_uuid: slot identity, or Hygon's issued one);
- a CI with processes on it cannot be destroyed (NVML's IN_USE);
- an armed `halfway` fault is the library failing after a create's GI step (the CI create and the
  undo's GI destroy fail) or after a destroy's CI step (the GI destroy fails);
- a destroy given a latency keeps the instance, CI and all, listed as "destroying" until the
  driver finishes it after sleeping outside the lock.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence

from partkeeper.drivers import mig, profiles
from partkeeper.drivers.base import (
    Card,
    CardLostError,
    ContainerEdits,
    DriverError,
    IdentityRule,
    Instance,
    InstanceSpec,
    InUseError,
    NotFoundError,
    PlacementError,
    issued_identity,
    nvidia_card_edits,
    nvidia_edits,
    slot_identity,
)
from partkeeper.drivers.vendor import one_partition
from partkeeper_sim.driver_state import SimCard, SimInstance, SimState, instance_uuid


def identity_rule(model: str) -> IdentityRule:
    """The identity rule of the vendor of a card of `model`, as its real driver states it."""
    return issued_identity if profiles.model(model).vendor == "hygon" else slot_identity


def container_edits(
    instances: Sequence[Instance], model_of: Callable[[int], str]
) -> ContainerEdits:
    """Each vendor's rules without its device nodes (the sim has none): NVIDIA's env for
    NVIDIA cards; one partition per container on T-Head and Hygon, Hygon's env variable."""
    found = {profiles.model(model_of(i.card)).vendor for i in instances}
    if found <= {"nvidia"}:
        return nvidia_edits(instances)
    inst = one_partition(instances, "/".join(sorted(found - {"nvidia"})))
    env = {"DMI_MIG_VISIBLE_DEVICE": inst.uuid} if "hygon" in found else {}
    return ContainerEdits(env=env)


def card_edits(cards: Sequence[Card], model_of: Callable[[int], str]) -> ContainerEdits:
    """Each vendor's rule for whole cards without device nodes: the card UUIDs in NVIDIA's
    env for NVIDIA cards; nothing for T-Head and Hygon cards, whose hand-off is nodes only."""
    shown = [c for c in cards if profiles.model(model_of(c.index)).vendor == "nvidia"]
    return nvidia_card_edits(shown) if shown else ContainerEdits()


class SimBinding(mig.Binding):
    """What the simulated cards answer, over the state one transaction holds locked. A GI's and a
    CI's handle is its GI id."""

    library = "sim"

    def __init__(self, state: SimState, *, carved: bool = False) -> None:
        self.state = state
        self.carved = carved  # instances made are foreign (`sim carve`, a create by hand)
        # The operation's `halfway` fault, armed by the driver: the library fails after the
        # operation's first step.
        self.halfway: DriverError | None = None
        self.destroy_delay = 0.0  # seconds a destroy left its instance "destroying" (its latency)

    # -- cards ----------------------------------------------------------------------------------

    def count(self) -> int:
        return len(self.state.cards)

    def device(self, op: str, card: int) -> SimCard:
        self._known(card, op, PlacementError if op == "create" else NotFoundError)
        if card in self.state.lost:
            # As NVML answers for a card fallen off the bus (NVML_ERROR_GPU_IS_LOST).
            raise CardLostError(op, card, None, "GPU is lost")
        return self.state.cards[card]

    def _known(self, card: int, op: str, error: type[DriverError]) -> None:
        if not 0 <= card < len(self.state.cards):
            raise error(op, card, None, f"no such card; the node has {len(self.state.cards)}")

    def model(self, card: int, op: str) -> str:
        self._known(card, op, NotFoundError)
        return self.state.cards[card].model

    def card(
        self, op: str, index: int, dev: SimCard, catalogue: Callable[[], mig.Catalogue]
    ) -> Card:
        return Card(dev.index, dev.uuid, dev.model, dev.mode, profiles.model(dev.model).memory_mib)

    def mig_modes(self, op: str, card: int, dev: SimCard) -> tuple[bool, bool]:
        on = dev.mode == "partition"
        return on, on

    def catalogue(self, op: str, card: int, dev: SimCard) -> mig.Catalogue:
        return _catalogue(dev.model)

    # -- instances ------------------------------------------------------------------------------

    def gpu_instances(
        self, op: str, card: int, dev: SimCard, profile: mig.GiProfile
    ) -> list[mig.Gi]:
        return [_gi(i, profile) for i in dev.instances if i.profile == profile.name]

    def gpu_instance(
        self, op: str, card: int, dev: SimCard, gi_id: int,
        catalogue: Callable[[], mig.Catalogue],
    ) -> mig.Gi:
        for inst in dev.instances:
            if inst.gi_id == gi_id:
                profile = next(p for p in catalogue().profiles if p.name == inst.profile)
                return _gi(inst, profile)
        raise mig.NoGpuInstance(gi_id)

    def compute_instances(
        self, op: str, card: int, dev: SimCard, gis: Sequence[mig.Gi]
    ) -> dict[int, list[mig.Ci]]:
        return {i.gi_id: [mig.Ci(i.ci_id, i.uuid)] for i in dev.instances if i.ci_id >= 0}

    def _instance(self, card: int, gi_id: int) -> SimInstance:
        return next(i for i in self.state.cards[card].instances if i.gi_id == gi_id)

    # -- create ---------------------------------------------------------------------------------

    def create_gi(
        self, card: int, dev: SimCard, profile: mig.GiProfile, start: int, size: int
    ) -> int:
        taken = next((i for i in dev.instances
                      if profiles.overlaps((start, size), (i.start, i.size))), None)
        if taken is not None:
            cause = f"slices {start}-{start + size - 1} are taken (insufficient resources)"
            raise PlacementError("create", card, taken.uuid or f"GI {taken.gi_id}", cause)
        used = {i.gi_id for i in dev.instances}
        gi_id = next(n for n in itertools.count(1) if n not in used)
        dev.instances.append(
            SimInstance(gi_id, -1, "", profile.name, start, size, carved=self.carved)
        )
        return gi_id

    def gi_id(self, card: int, gi: int) -> int:
        return gi

    def create_ci(self, card: int, gi: mig.Gi, profile: mig.GiProfile) -> int:
        if self.halfway is not None:
            raise self.halfway
        inst = self._instance(card, gi.gi_id)
        inst.ci_id = 0
        inst.uuid = instance_uuid(self.state.cards[card], gi.gi_id, 0, inst.profile, inst.start)
        return gi.gi_id

    def new_ci(self, card: int, gi: mig.Gi, handle: int) -> mig.Ci:
        inst = self._instance(card, gi.gi_id)
        return mig.Ci(inst.ci_id, inst.uuid)

    # -- destroy and busy -----------------------------------------------------------------------

    def _delayed(self, op: str) -> bool:
        return op == "destroy" and self.state.latency_ms.get("destroy", 0) > 0

    def destroy_ci(self, op: str, card: int, gi: mig.Gi, ci: mig.Ci) -> None:
        inst = self._instance(card, gi.gi_id)
        if inst.busy:
            raise InUseError(op, card, inst.uuid, "processes are running on the instance")
        if not self._delayed(op):  # a slow destroy keeps its CI listed until it is done
            inst.ci_id, inst.uuid = -1, ""

    def destroy_gi(self, op: str, card: int, name: str, gi: mig.Gi) -> None:
        if self.halfway is not None:
            raise self.halfway
        inst = self._instance(card, gi.gi_id)
        if self._delayed(op):
            inst.state = "destroying"
            self.destroy_delay = self.state.latency_ms["destroy"] / 1000.0
        else:
            self.state.cards[card].instances.remove(inst)

    def finish_destroy(self, expected: Instance) -> None:
        """The end of a destroy given a latency: the instance it left "destroying" goes. Of two
        racing destroys, the one finishing second finds it gone."""
        self._known(expected.card, "destroy", NotFoundError)
        card = self.state.cards[expected.card]
        left = [i for i in card.instances
                if not (i.gi_id == expected.gi_id and i.state == "destroying")]
        if len(left) == len(card.instances):
            cause = f"no GPU instance {expected.gi_id} exists"
            raise NotFoundError("destroy", expected.card, expected.uuid, cause)
        card.instances = left

    def processes(self, op: str, card: int, ci: mig.Ci) -> int:
        """The simulated cards know busy or not: one process, or none."""
        inst = next((i for i in self.state.cards[card].instances if i.uuid == ci.uuid), None)
        return int(inst is not None and inst.busy)

    # -- what a container gets ------------------------------------------------------------------

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits:
        return container_edits(instances, lambda card: self.model(card, "allocate"))

    def card_edits(self, cards: Sequence[Card]) -> ContainerEdits:
        return card_edits(cards, lambda card: self.model(card, "allocate"))

    def carve_spec(self, card: int, profile: str, start: int | None) -> InstanceSpec:
        """What `sim carve` asks for, checked in the control's own words (a hand tool names the
        card's mode and the model's profiles), the start defaulting to the lowest free one."""
        self._known(card, "carve", PlacementError)
        dev = self.state.cards[card]
        if dev.mode != "partition":
            cause = "the card is in sliced mode, not partition"
            raise PlacementError("carve", card, None, cause)
        offered = profiles.model(dev.model).profiles
        if profile not in offered:
            cause = f"{dev.model} has no profile {profile!r}; it offers {', '.join(offered)}"
            raise PlacementError("carve", card, None, cause)
        if start is not None:
            return InstanceSpec(card, profile, start)
        size = offered[profile].size
        for free in offered[profile].starts:
            if not any(profiles.overlaps((free, size), (i.start, i.size)) for i in dev.instances):
                return InstanceSpec(card, profile, free)
        raise PlacementError("carve", card, None, f"no free placement for {profile} is left")


@functools.cache
def _catalogue(model: str) -> mig.Catalogue:
    """The tables' profiles of `model`, in the tables' placements: the simulated library offers
    exactly what partkeeper's tables say (read once per model: the tables do not change)."""
    found = tuple(
        mig.GiProfile(p.name, pid, p.compute_slices, profiles.max_instances(p), p.placements(), p)
        for pid, p in enumerate(profiles.model(model).profiles.values())
    )
    return mig.Catalogue(model, found)


def _gi(inst: SimInstance, profile: mig.GiProfile) -> mig.Gi:
    return mig.Gi(inst.gi_id, inst.gi_id, profile.id, inst.start, inst.size, profile.slices)


class SimMig(mig.MigDriver):
    """The one MIG algorithm over one transaction's SimBinding, with each card's vendor's
    identity rule."""

    def __init__(self, binding: SimBinding) -> None:
        super().__init__(binding)
        self.binding = binding

    def same_partition(self, recorded: Instance, listed: Instance) -> bool:
        return identity_rule(self.binding.model(listed.card, "identity"))(recorded, listed)
