"""The one MIG algorithm, over a small binding to each vendor's library.

NVIDIA's NVML, T-Head's HGML and Hygon's DMI all have NVML's shape: GPU-instance profiles with
legal placements, GPU instances (GI) created at a placement, compute instances (CI) inside them.
A partition is one GI holding one CI that spans it. `MigDriver` is the Driver protocol written once
over that shape (listing, create at a placement with the leftover and overlap checks, the busy
check, destroy with its identity check, registry leftovers, the probe view); a `Binding` says how
one library is called, and nothing more. This is how NVIDIA's DRA driver is built too: one
algorithm over go-nvml's `nvml.Interface` (k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/nvlib.go).

Every enumeration fails closed: a failed library read is a ReadError, never an empty or shorter
list. Each error names the card, the instance and what the library said (base.DriverError).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from partkeeper.drivers import profiles
from partkeeper.drivers.base import (
    Card,
    CardLostError,
    ContainerEdits,
    DriverError,
    Instance,
    InstanceSpec,
    ModeOffError,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
    identity_mismatch,
    lost_card,
)
from partkeeper.drivers.cardhealth import EventSource

Placements = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class GiProfile:
    """One GPU-instance profile as the library reports it."""

    name: str  # the tables' name where `ours` is set ("1g.10gb"), else the library's ("1g.10gb+me")
    id: int  # the library's profile id, which listing and create take
    slices: int  # compute slices: the whole-GI compute profile has as many
    max_count: int
    placements: Placements  # (start, size) as the library reports them
    ours: profiles.Profile | None  # the table's profile partkeeper creates; None: shown only
    probe: int | None = None  # the index or slice query the library answered it for
    # The library's answer when it gives no placements for a profile it lists ("" when it gave
    # them): NVML answers NOT_SUPPORTED or INVALID_ARGUMENT for some (see nvidia/tables.py).
    unplaceable: str = ""

    @property
    def offered(self) -> bool:
        return self.ours is not None


@dataclass(frozen=True, slots=True)
class Catalogue:
    """What a card offers, read once per card (it changes only with the mode)."""

    model: str | None  # the profiles.py model; None: not in the tables, or refused (`problem`)
    profiles: tuple[GiProfile, ...]
    problem: str = ""  # why a card of a known model is refused ("" when it agrees)
    library_name: str = ""  # the card's name as the library says it, for probe ("": not shown)

    def by_id(self, profile_id: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.id == profile_id), None)


@dataclass(frozen=True, slots=True)
class Gi:
    handle: Any
    gi_id: int
    profile_id: int
    start: int
    size: int
    slices: int = 0  # its profile's compute slices, where the listing knew them (DMI needs them)


@dataclass(frozen=True, slots=True)
class Ci:
    """A compute instance with the UUID its partition is known by."""

    ci_id: int
    uuid: str
    device: Any = None  # its MIG device handle, where the library has one (process queries)
    handle: Any = None  # its CI handle, where listing gave one (else it is looked up by id)


class NoGpuInstance(Exception):
    """The library positively answers that no GPU instance has the id."""


class ModeSwitchedOff(Exception):
    """The library answers a GI lookup with "MIG mode is off": no GPU instance can exist."""


NO_PROCESS_QUERY = (
    "the {library} library has no per-partition process query; whether the partition is in use "
    "is unknown until a destroy says IN_USE"
)


class Binding(Protocol):
    """How one vendor library is called. Every method maps the library's failures to the driver
    errors (ReadError for a read, InUse/Placement/UnknownError for a change), naming the card.

    The methods with a body are optional capabilities: a binding subclasses this protocol and
    overrides those its library has."""

    library: str  # "NVML", "HGML", "DMI": how error messages name the library

    def count(self) -> int: ...

    def device(self, op: str, card: int) -> Any: ...

    def card(self, op: str, index: int, dev: Any, catalogue: Callable[[], Catalogue]) -> Card:
        """The card's static facts; `catalogue` reads (and caches) its profiles if needed."""
        ...

    def mig_modes(self, op: str, card: int, dev: Any) -> tuple[bool, bool] | None:
        """(current, pending) partition mode; None for a card without it at all."""
        ...

    def catalogue(self, op: str, card: int, dev: Any) -> Catalogue: ...

    def gpu_instances(self, op: str, card: int, dev: Any, profile: GiProfile) -> list[Gi]: ...

    def gpu_instance(
        self, op: str, card: int, dev: Any, gi_id: int, catalogue: Callable[[], Catalogue]
    ) -> Gi:
        """The GI with `gi_id` (DMI, which has no lookup by id, finds it in the listing of the
        `catalogue`'s profiles). Raises NoGpuInstance, ModeSwitchedOff or ReadError."""
        ...

    def compute_instances(
        self, op: str, card: int, dev: Any, gis: Sequence[Gi]
    ) -> dict[int, list[Ci]]:
        """The CIs by GI id, lowest CI id first. NVML and HGML walk the card's MIG devices once
        (`gis` unused); DMI lists the CIs of each of `gis`."""
        ...

    def create_gi(self, card: int, dev: Any, profile: GiProfile, start: int, size: int) -> Any:
        """The new GI's handle. Raises PlacementError where the library refuses the placement."""
        ...

    def gi_id(self, card: int, gi: Any) -> int: ...

    def create_ci(self, card: int, gi: Gi, profile: GiProfile) -> Any:
        """The handle of the whole-GI CI, made in `gi`."""
        ...

    def new_ci(self, card: int, gi: Gi, handle: Any) -> Ci:
        """The new CI as the library describes it; `uuid` is "" where only a walk can tell."""
        ...

    def destroy_ci(self, op: str, card: int, gi: Gi, ci: Ci) -> None:
        """Destroy `ci` (a CI already gone is no error: the GI still has to go)."""
        ...

    def destroy_gi(self, op: str, card: int, name: str, gi: Gi) -> None: ...

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits: ...

    def card_edits(self, cards: Sequence[Card]) -> ContainerEdits: ...

    # -- optional capabilities ----------------------------------------------------------------

    node_wide_mode: bool = False  # the mode is one switch for the node (Hygon), shown by probe

    def counts_processes(self) -> bool:
        """Whether the library can count the processes on a MIG device (Hygon's cannot)."""
        return True

    def processes(self, op: str, card: int, ci: Ci) -> int:
        """How many processes run on `ci`'s MIG device."""
        raise ReadError(op, card, ci.uuid or None, NO_PROCESS_QUERY.format(library=self.library))

    def leftovers(self) -> list[str]:
        """Host files that block creates and that the reclaimer may remove (none by default)."""
        return []

    def remove_leftover(self, record: str) -> None:
        raise ValueError(f"{record} is no leftover of the {self.library} driver")

    def events(self) -> EventSource | None:
        """The library's card events (critical errors, a lost card); None where the library
        has no event source (docs/drivers.md, "Card health")."""
        return None

    def close(self) -> None:
        return None


class MigDriver:
    """The Driver protocol over a Binding. Holds the binding and each card's catalogue."""

    name = "mig"

    def __init__(self, binding: Binding) -> None:
        self._b = binding
        self._catalogues: dict[int, Catalogue] = {}
        # Where the last create found its UUID: "ci handle" (the CI's own answer, one call) or
        # "walk" (a walk of the MIG devices); for `partkeeper probe --check --mutate`.
        self.uuid_source = ""

    same_partition: Callable[[Instance, Instance], bool]

    def close(self) -> None:
        self._b.close()

    def events(self) -> EventSource | None:
        return self._b.events()

    # -- static card facts --------------------------------------------------------------------

    def catalogue(self, op: str, card: int, dev: Any) -> Catalogue:
        """Cached once non-empty: the profiles change only with the mode, which partkeeper picks
        up by restarting; an empty catalogue (a card with the mode off) is read again."""
        if card in self._catalogues:
            return self._catalogues[card]
        found = self._b.catalogue(op, card, dev)
        if found.profiles:
            self._catalogues[card] = found
        return found

    def _enabled(self, op: str, card: int, dev: Any) -> bool:
        modes = self._b.mig_modes(op, card, dev)
        return modes is not None and modes[0]  # a card without MIG at all is sliced

    # -- enumeration --------------------------------------------------------------------------

    def cards(self) -> list[Card]:
        return [self._card_or_lost(index) for index in range(self._b.count())]

    def _card_or_lost(self, index: int) -> Card:
        try:
            return self._card(index)
        except CardLostError as exc:
            return lost_card(index, exc)

    def _card(self, index: int) -> Card:
        dev = self._b.device("list", index)
        return self._b.card("list", index, dev, lambda: self.catalogue("list", index, dev))

    def instances(self, card: int) -> list[Instance]:
        dev = self._b.device("list", card)
        if not self._enabled("list", card, dev):
            return []
        return self._listed("list", card, dev)[0]

    def _listed(self, op: str, card: int, dev: Any) -> tuple[list[Instance], list[Gi]]:
        """The card's instances, mode on: its GPU instances and one walk of their CIs."""
        cat = self.catalogue(op, card, dev)
        gis = sorted((gi for p in cat.profiles for gi in self._b.gpu_instances(op, card, dev, p)),
                     key=lambda gi: gi.start)
        cis = self._b.compute_instances(op, card, dev, gis)
        return [self._instance(card, cat, gi, cis.get(gi.gi_id, [])) for gi in gis], gis

    def _instance(self, card: int, cat: Catalogue, gi: Gi, cis: Sequence[Ci]) -> Instance:
        # A GI without a CI (an interrupted create or destroy, or carved by hand) still occupies
        # its slices: listed with CI id -1 and no UUID rather than left out.
        known = cat.by_id(gi.profile_id)
        label = known.name if known else f"{self._b.library.lower()}-profile-{gi.profile_id}"
        ci_id, uuid = (cis[0].ci_id, cis[0].uuid) if cis else (-1, "")
        return Instance(card, label, gi.start, gi.size, gi.gi_id, ci_id, uuid)

    # -- create -------------------------------------------------------------------------------

    def create(self, spec: InstanceSpec) -> Instance:
        """Create a partition at `spec`. A GPU instance without compute instance exactly at
        `spec` (a create interrupted between its two steps) is completed instead."""
        op, card = "create", spec.card
        dev = self._b.device(op, card)
        if not self._enabled(op, card, dev):
            where = "the node's" if self._b.node_wide_mode else "the card's"
            raise PlacementError(op, card, None, f"{where} MIG mode is not enabled")
        cat = self.catalogue(op, card, dev)
        chosen, ours = legal_shape(spec, cat, self._b.library)
        existing, gis = self._listed(op, card, dev)  # a failed read refuses the create
        leftover = leftover_at(spec, existing)
        if leftover is not None:
            gi = next(g for g in gis if g.gi_id == leftover.gi_id)
            return self._complete(spec, ours, chosen, dev, gi)
        refuse_overlap(spec, ours.size, existing)
        handle = self._b.create_gi(card, dev, chosen, spec.start, ours.size)
        return self._complete(spec, ours, chosen, dev, Gi(handle, -1, chosen.id, spec.start,
                                                          ours.size))

    def _complete(
        self, spec: InstanceSpec, ours: profiles.Profile, chosen: GiProfile, dev: Any, gi: Gi
    ) -> Instance:
        """Give the GI its whole-GI CI and find its UUID; on any failure, undo the GI."""
        ci: Ci | None = None
        step = "reading the new GPU instance"
        try:
            gi_id = gi.gi_id if gi.gi_id >= 0 else self._b.gi_id(spec.card, gi.handle)
            gi = Gi(gi.handle, gi_id, gi.profile_id, gi.start, gi.size, chosen.slices)
            step = "creating its compute instance"
            made = self._b.create_ci(spec.card, gi, chosen)
            ci = Ci(-1, "", handle=made)  # made: an undo destroys it, whatever comes next
            ci = self._b.new_ci(spec.card, gi, made)
            step = "finding its MIG device UUID"
            uuid = self._new_uuid(spec.card, dev, gi, ci)
        except DriverError as exc:
            raise self._undo(spec, gi, ci, f"{step} failed ({exc.cause})") from exc
        return Instance(spec.card, spec.profile, spec.start, ours.size, gi_id, ci.ci_id, uuid)

    def _new_uuid(self, card: int, dev: Any, gi: Gi, ci: Ci) -> str:
        """The new CI's UUID: its own answer where the binding has one (NVML's CI device handle,
        "a MIG device handle maps 1:1 to a CI" as NVIDIA's DRA driver reads it; DMI's registry
        record), else one walk of the MIG devices."""
        if ci.uuid:
            self.uuid_source = "ci handle"
            return ci.uuid
        self.uuid_source = "walk"
        found = self._b.compute_instances("create", card, dev, [gi]).get(gi.gi_id, [])
        uuid = next((c.uuid for c in found if c.ci_id == ci.ci_id), "")
        if not uuid:
            raise UnknownError("create", card, None, "no MIG device reports it")
        return uuid

    def _undo(self, spec: InstanceSpec, gi: Gi, ci: Ci | None, cause: str) -> UnknownError:
        """Undo a create that failed after its GPU instance existed (the allocator's own undo,
        invariant 2): the CI, if one was made, then the GI. The error says whether the undo left
        anything behind for the reclaimer to find."""
        what = f"the {spec.profile} GPU instance at start {spec.start} was created but {cause}"
        try:
            if ci is not None:
                self._b.destroy_ci("create", spec.card, gi, ci)
            self._b.destroy_gi("create", spec.card, f"GI {gi.gi_id}", gi)
        except DriverError as exc:
            return UnknownError("create", spec.card, None,
                                f"{what}; undoing it failed too ({exc.cause})")
        return UnknownError("create", spec.card, None, f"{what}; it was destroyed again")

    # -- destroy and busy ---------------------------------------------------------------------

    def destroy(self, expected: Instance) -> None:
        op, card = "destroy", expected.card
        name = expected.uuid or f"GI {expected.gi_id}"
        dev = self._b.device(op, card)
        try:
            gi = self._b.gpu_instance(op, card, dev, expected.gi_id,
                                      lambda: self.catalogue(op, card, dev))
        except NoGpuInstance as exc:
            cause = f"no GPU instance {expected.gi_id} exists"
            raise NotFoundError(op, card, name, cause) from exc
        except ModeSwitchedOff as exc:
            cause = (f"{self._b.library} answers {exc} for GPU instance {expected.gi_id}: MIG "
                     "mode was switched off on the card, so no GPU instance can exist on it")
            raise ModeOffError(op, card, name, cause) from exc
        cat = self.catalogue(op, card, dev)
        cis = self._b.compute_instances(op, card, dev, [gi]).get(expected.gi_id, [])
        found = self._instance(card, cat, gi, [c for c in cis if c.uuid == expected.uuid] or cis)
        if not self.same_partition(expected, found):
            raise identity_mismatch(expected, found)
        for ci in cis:
            self._b.destroy_ci(op, card, gi, ci)
        self._b.destroy_gi(op, card, name, gi)

    def is_busy(self, instance: Instance) -> bool:
        op, card = "busy", instance.card
        if not self._b.counts_processes():
            cause = NO_PROCESS_QUERY.format(library=self._b.library)
            raise ReadError(op, card, instance.uuid or None, cause)
        cis = self._cis(op, card, instance.gi_id)
        if instance.uuid and all(c.uuid != instance.uuid for c in cis):
            cause = f"no MIG device of GPU instance {instance.gi_id} has this UUID"
            raise NotFoundError(op, card, instance.uuid, cause)
        return sum(self._b.processes(op, card, c) for c in cis) > 0  # the same walk

    def processes(self, op: str, card: int, gi_id: int) -> int | None:
        """How many processes run on GPU instance `gi_id`; None where the library cannot tell."""
        if not self._b.counts_processes():
            return None
        return sum(self._b.processes(op, card, c) for c in self._cis(op, card, gi_id))

    def _cis(self, op: str, card: int, gi_id: int) -> list[Ci]:
        dev = self._b.device(op, card)
        return self._b.compute_instances(op, card, dev, ()).get(gi_id, [])

    # -- what a container gets, leftovers, probe ----------------------------------------------

    def container_edits(self, instances: Sequence[Instance]) -> ContainerEdits:
        return self._b.container_edits(instances)

    def card_edits(self, cards: Sequence[Card]) -> ContainerEdits:
        return self._b.card_edits(cards)

    def leftovers(self) -> list[str]:
        """Host files that block creates (Hygon's squatted registry records), for the reclaimer."""
        return self._b.leftovers()

    def remove_leftover(self, record: str) -> None:
        self._b.remove_leftover(record)

    def probe_view(self, card: int) -> dict[str, Any]:
        """The partition mode (current and pending) and the library's profiles beside the tables,
        for `partkeeper probe` (read-only)."""
        dev = self._b.device("probe", card)
        modes = self._b.mig_modes("probe", card, dev)
        mig = None if modes is None else {"current": modes[0], "pending": modes[1]}
        if mig is not None and self._b.node_wide_mode:
            mig["node_wide"] = True
        view: dict[str, Any] = {"mig": mig, "profiles": []}
        if modes is not None and modes[0]:
            cat = self.catalogue("probe", card, dev)
            if cat.library_name:
                view["nvml_name"] = cat.library_name
            view["profiles"] = [profile_view(p) for p in cat.profiles]
        return view


def walk(
    total: int, device_at: Callable[[int], Any | None], ids: Callable[[Any], tuple[int, int, str]]
) -> dict[int, list[Ci]]:
    """One walk of the MIG device indices 0..total-1, as NVML and HGML have them: `device_at`
    gives the MIG device at an index (None: none there), `ids` its (GI id, CI id, UUID). Four
    library calls per device, which NVIDIA measured at seconds under load (k8s-dra-driver-gpu,
    cmd/gpu-kubelet-plugin/nvlib.go createMigDevice): so every operation walks at most once."""
    found: dict[int, list[Ci]] = {}
    for index in range(total):
        mig = device_at(index)
        if mig is None:
            continue
        gi_id, ci_id, uuid = ids(mig)
        found.setdefault(gi_id, []).append(Ci(ci_id, uuid, device=mig))
    for cis in found.values():
        cis.sort(key=lambda c: c.ci_id)
    return found


# -- pure decisions over what the library reported ----------------------------------------------


def same_placements(library: Iterable[tuple[int, int]], table: Iterable[tuple[int, int]]) -> bool:
    """A library's placements against a table's, as sets: the library's order is no promise."""
    return set(library) == set(table)


def legal_shape(
    spec: InstanceSpec, cat: Catalogue, library: str
) -> tuple[GiProfile, profiles.Profile]:
    """The library's profile and ours for `spec`, refusing what the tables or the library do not
    allow, before anything is created."""
    if cat.model is None:
        cause = cat.problem or "the card's model is not in partkeeper's profile tables"
        raise PlacementError("create", spec.card, None, cause)
    chosen = next((p for p in cat.profiles if p.ours and p.name == spec.profile), None)
    if chosen is None or chosen.ours is None:
        names = ", ".join(sorted(p.name for p in cat.profiles if p.offered)) or "none"
        cause = (f"{cat.model} offers no GPU-instance profile {spec.profile!r} through {library} "
                 f"(offers {names})")
        raise PlacementError("create", spec.card, None, cause)
    ours = chosen.ours
    if spec.start not in ours.starts or (spec.start, ours.size) not in set(chosen.placements):
        legal = ", ".join(str(s) for s in ours.starts if (s, ours.size) in chosen.placements)
        cause = f"start {spec.start} is not a legal placement of {spec.profile} ({legal})"
        raise PlacementError("create", spec.card, None, cause)
    return chosen, ours


def leftover_at(spec: InstanceSpec, existing: Iterable[Instance]) -> Instance | None:
    """A GPU instance exactly at `spec` left without its compute instance (a create interrupted
    between its two steps): the retried create completes it rather than refusing the slot."""
    return next((i for i in existing
                 if (i.profile, i.start) == (spec.profile, spec.start) and not i.complete), None)


def refuse_overlap(
    spec: InstanceSpec, size: int, existing: Iterable[Instance], op: str = "create"
) -> None:
    """PlacementError naming the first of `existing` that `size` slices at `spec` overlap."""
    for other in existing:
        if profiles.overlaps((spec.start, size), other.placement):
            cause = (f"slices {spec.start}-{spec.start + size - 1} overlap this {other.profile} "
                     f"at start {other.start}")
            raise PlacementError(op, spec.card, other.uuid or f"GI {other.gi_id}", cause)


def profile_view(p: GiProfile) -> dict[str, Any]:
    """One GI profile as `partkeeper probe` shows it: the library's id (`nvml_id`), the index or
    slice query it answered (`nvml_profile`) and its placements beside the table's (none for a
    profile the tables do not know)."""
    table = p.ours.placements() if p.ours else None
    return {
        "name": p.name, "nvml_id": p.id, "nvml_profile": p.probe, "offered": p.offered,
        "instances": p.max_count, "placements": [list(x) for x in p.placements],
        "placements_error": p.unplaceable or None,
        "table_placements": None if table is None else [list(x) for x in table],
        "matches": None if table is None else same_placements(p.placements, table),
    }
