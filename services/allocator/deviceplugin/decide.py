"""What an Allocate does, decided: which Pod and container it serves, and where its partitions
go. Pure functions of what the shell gathered (`podmatch.py` asks the watcher and kubelet,
`allocate.py` reads the claims and the cards and acts on the answer), tested exhaustively.

## Which Pod

kubelet does not say which container an Allocate is for. Two questions answer it:

- **Is it kubelet's retry?** kubelet passes the same device IDs again for the same container;
  those IDs are on the claims it got the first time (invariant 7): `existing`, `missing`. kubelet
  re-calls `Allocate` for a container only while it still admits that container: its Pod is
  Pending and, when the pod-resources API answers, kubelet lists the container without devices of
  the resource. A token handed out again otherwise was freed: the holder's containers stopped
  (kubelet frees devices at once, while the status reaches the API server later) or the holder
  was rejected. Only a retry gets the claim's partition (`holder`); anything else is a new
  allocation for the Pod kubelet is admitting now.
- **Otherwise, which pending container?** The watcher lists the pending Pods of this node
  requesting the resource in that quantity, oldest first by (creationTimestamp, namespace, name),
  as kubelet admits them. Containers that already hold a claim are skipped; when kubelet's
  pod-resources API answers, only containers it lists without devices of that resource remain
  (the one it is admitting right now): `survivors`, then `chosen`.

## Where

The placement itself is `core.placement.place` (legal placements minus claims and instances).
Around it, for one Allocate:

- `after_miss`: what follows a plan that wrote nothing: plan again on a fresh read, make room,
  plan again at once, wait for a change, or refuse once the Allocate's deadline has come;
- `ROOM_WAIT`: the schedule of the waits for a change, bounded by the deadline;
- `reclaim_plan`: the claims reclaimable now (`partkeeper.podstate.reclaimable_now`, shared with
  the reclaimer's `reclaim.now`) whose destruction would make room, or None when even destroying
  all of them would not;
- `suspects`: the Pods of the other holders, to be asked about afresh;
- `describe`: the refusal sentence, naming what is full and what holds it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from enum import Enum

from partkeeper import backoff
from partkeeper.drivers.profiles import overlaps
from partkeeper.podstate import reclaimable_now
from schemas import Claim, PodRecord
from schemas.pods import InvalidPodUID, validate_pod_uid
from services.allocator.core.catalog import Offer
from services.allocator.core.placement import Snapshot, Spot, Target, place

log = logging.getLogger(__name__)

# (namespace, name) -> container -> resources the container already holds devices of, as
# kubelet's pod-resources API lists them (`podmatch.PodResources.view`)
KubeletView = Mapping[tuple[str, str], Mapping[str, frozenset[str]]]


class Holder(Enum):
    """What the claims carrying an Allocate's device IDs mean."""

    RETRY = "retry"  # the same container asks again: return (or complete) its partition
    DEAD = "dead"  # the holder is confirmed finished or gone: its room is reclaimable
    HANDED_ON = "handed on"  # the holder looks live but kubelet freed its tokens


def existing(claims: Iterable[Claim], resource: str, device_ids: Sequence[str]) -> list[Claim]:
    """The creating/active claims of one container that carry these device IDs.

    A token carried by several claims (kubelet re-used it after its first holder stopped) belongs
    to the newest. Empty when no claim carries them, or when they are spread over several
    containers' claims: then kubelet re-used freed tokens and this is a new allocation. Claims
    carrying only some of the IDs are a group whose writing was cut short (a crash between the
    claim writes) only when all of them are still `creating`; see `missing`.
    """
    wanted = set(device_ids)
    newest: dict[str, Claim] = {}
    for claim in claims:
        if claim.resource != resource or claim.state not in ("creating", "active"):
            continue
        for token in wanted.intersection(claim.device_ids):
            current = newest.get(token)
            if current is None or (claim.created_at, claim.id) > (current.created_at, current.id):
                newest[token] = claim
    mine = list({c.id: c for c in newest.values()}.values())
    if not mine:
        return []
    owners = {(c.pod_uid, c.container) for c in mine}
    carried = {t for c in mine for t in c.device_ids}
    if len(owners) != 1 or not carried <= wanted:
        return []
    if carried != wanted and any(c.state != "creating" for c in mine):
        return []
    return mine


def missing(group: Iterable[Claim], device_ids: Sequence[str]) -> list[str]:
    """The IDs of a retried Allocate that no claim of its group carries yet, in their order."""
    carried = {t for c in group for t in c.device_ids}
    return [t for t in device_ids if t not in carried]


def admitting(kubelet: KubeletView | None, claim: Claim) -> bool:
    """kubelet still admits the claim's Pod (or cannot say): it lists the Pod (pod-resources
    lists only active Pods) and the claim's container without devices of its resource, or not
    at all: an init container, never listed, whose devices kubelet hands to the containers
    after it with the same IDs, so they get the same partition."""
    if kubelet is None:
        return True
    containers = kubelet.get((claim.namespace, claim.name))
    if containers is None:
        return False
    return claim.resource not in containers.get(claim.container, frozenset())


def after_reboot(claim: Claim) -> bool:
    """The claim's partition was removed by a host reboot (`rebooted`), or re-made since in this
    boot (`remakes`, no longer rebooted): kubelet starts the containers of Pods that were
    running again after a reboot, with the device IDs of its checkpoint, though the API server
    still shows those Pods Running, not being admitted (docs/operations.md, "After a reboot")."""
    return claim.rebooted or claim.remakes > 0


def restarting(kubelet: KubeletView | None, claim: Claim) -> bool:
    """kubelet still counts the claim's Pod active (pod-resources lists only active Pods), or
    cannot say. A Pod kubelet no longer lists has stopped; its IDs were freed and handed on."""
    return kubelet is None or (claim.namespace, claim.name) in kubelet


def holder(
    claim: Claim, *, dead: bool, being_admitted: bool, kubelet: KubeletView | None
) -> Holder:
    """What the claim carrying the device IDs means. `dead`: the Pod view or the watcher, asked
    afresh, says its Pod finished or is gone; `being_admitted`: the watcher's fresh answer says
    the Pod is still being admitted; `kubelet`: the pod-resources view (None: no answer).

    After a reboot (`after_reboot`), the live Pod's container asking again for its IDs is
    kubelet starting it again: a retry, whose partition is re-made (core/remake.py) or, once
    re-made, returned again."""
    if dead:
        return Holder.DEAD
    if being_admitted and admitting(kubelet, claim):
        return Holder.RETRY
    if after_reboot(claim) and restarting(kubelet, claim):
        return Holder.RETRY
    return Holder.HANDED_ON


def candidates(
    pods: Sequence[PodRecord], resource: str, quantity: int, claimed: Set[tuple[str, str]]
) -> list[Target]:
    """Unclaimed containers requesting exactly `quantity` of `resource`, in admission order."""
    found: list[Target] = []
    for pod in pods:
        try:
            validate_pod_uid(pod.uid)
        except InvalidPodUID as exc:
            log.warning("pods.pending listed a Pod with a malformed UID; skipped: %s", exc)
            continue
        for container in pod.containers:
            if container.requests.get(resource) != quantity:
                continue
            if (pod.uid, container.name) in claimed:
                continue
            found.append(Target(pod.uid, pod.namespace, pod.name, container.name))
    return found


def narrow(found: Sequence[Target], kubelet: KubeletView, resource: str) -> list[Target]:
    """Those of Pods kubelet lists (it lists only active Pods) whose container it lists without
    devices of `resource`, or does not list at all: pod-resources never lists (non-sidecar)
    init containers, which kubelet allocates first."""
    kept = []
    for t in found:
        pod = kubelet.get((t.namespace, t.name))
        if pod is not None and resource not in pod.get(t.container, frozenset()):
            kept.append(t)
    return kept


def first_per_pod(found: Sequence[Target]) -> list[Target]:
    """Within one Pod kubelet allocates in a fixed order (init containers, then the others, in
    spec order, as the watcher lists them), so only the first unclaimed container of each Pod
    is a candidate; several Pods left is an ambiguity."""
    first: dict[str, Target] = {}
    for target in found:
        first.setdefault(target.uid, target)
    return list(first.values())


def survivors(
    pods: Sequence[PodRecord],
    resource: str,
    quantity: int,
    claimed: Set[tuple[str, str]],
    kubelet: KubeletView | None,
) -> list[Target]:
    """The candidates left after narrowing, in admission order; one is the answer, several are
    confirmed with the watcher and waited on, none is retried."""
    found = candidates(pods, resource, quantity, claimed)
    return first_per_pod(found if kubelet is None else narrow(found, kubelet, resource))


def chosen(found: Sequence[Target]) -> Target | None:
    """The container the Allocate serves: the one candidate left, or None (none, or several:
    a wrong guess hands one Pod's partition to another, so several are never chosen from)."""
    return found[0] if len(found) == 1 else None


def handed_on(claim: Claim, target: Target, ids: Sequence[str]) -> str:
    """The first half of a refusal for room a handed-on token's holder still takes."""
    return (
        f"kubelet handed device IDs {','.join(ids)} to {target}, but claim {claim.id} of Pod "
        f"{claim.namespace}/{claim.name} ({claim.pod_uid}) holds them and the API server "
        "still shows that Pod live (kubelet saw its containers stop before its status was "
        "reported); "
    )


class Next(Enum):
    """What the shell does next to learn which Pod an Allocate serves (`which_pod`)."""

    READ_FRESH = "read the claims afresh"  # some claim carries the IDs: judged on a fresh read
    JUDGE = "ask about the holder"  # the watcher afresh and kubelet, about the group's Pod
    RESUME = "resume the group"  # kubelet's retry: the same partition(s), completed if need be
    LOOK = "look at the pending Pods"  # (again: afresh after the first look)
    CONFIRM = "confirm the candidates"  # several left: the watcher asked afresh about each
    SERVE = "serve the target"  # a new allocation for `target`


@dataclass(frozen=True, slots=True)
class Asked:
    """What kubelet asked: `ids` of `resource` for one container it does not name. `serving`:
    the containers other Allocates of this process are serving now (not candidates)."""

    resource: str
    ids: tuple[str, ...]
    serving: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True, slots=True)
class HolderSeen:
    """What the watcher (asked afresh) and kubelet say of the Pod holding the IDs (`holder`)."""

    dead: bool
    being_admitted: bool
    kubelet: KubeletView | None


@dataclass(frozen=True, slots=True)
class Looked:
    """One look at the pending Pods: the watcher's list and kubelet's view, read side by side.
    `problem`: why the watcher gave no usable answer (`answered` False)."""

    answered: bool
    pods: tuple[PodRecord, ...] = ()
    kubelet: KubeletView | None = None
    problem: str = ""


@dataclass(frozen=True, slots=True)
class Gathered:
    """What the shell has learned so far for one Allocate. `confirmed`: the candidates' UIDs the
    watcher, asked afresh, still knows as being admitted (the answer to CONFIRM on `looked`)."""

    claims: tuple[Claim, ...]
    fresh: bool
    holder: HolderSeen | None = None
    looked: Looked | None = None
    confirmed: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    next: Next
    group: tuple[Claim, ...] = ()  # RESUME: the retried container's claims; JUDGE: the holder's
    target: Target | None = None  # SERVE
    candidates: tuple[Target, ...] = ()  # CONFIRM: to ask about; LOOK: those left (several)
    handed_on: Claim | None = None  # the live-looking holder of IDs kubelet handed on
    seen: str = ""  # LOOK: what the last look saw, for the log and the refusal


def which_pod(asked: Asked, known: Gathered) -> Answer:
    """Which Pod and container this Allocate serves, or what to learn first (module docstring,
    "Which Pod"). Called again by the shell with each answer added to `known`, until it says
    RESUME or SERVE (the shell bounds the looks: the lookup policy and the deadline)."""
    group = tuple(existing(known.claims, asked.resource, asked.ids))
    handed: Claim | None = None
    if group:
        if not known.fresh:
            return Answer(Next.READ_FRESH)
        if known.holder is None:
            return Answer(Next.JUDGE, group=group)
        said = holder(group[0], dead=known.holder.dead,
                      being_admitted=known.holder.being_admitted, kubelet=known.holder.kubelet)
        if said is Holder.RETRY:
            return Answer(Next.RESUME, group=group)
        handed = group[0] if said is Holder.HANDED_ON else None
    looked = known.looked
    if looked is None:
        return Answer(Next.LOOK, handed_on=handed)
    if looked.problem:  # no usable answer, or the request refused (a miss like any other)
        return Answer(Next.LOOK, handed_on=handed, seen=looked.problem)
    claimed = {(c.pod_uid, c.container) for c in known.claims if c.resource == asked.resource}
    found = survivors(looked.pods, asked.resource, len(asked.ids), claimed | asked.serving,
                      looked.kubelet)
    if len(found) > 1:
        if known.confirmed is None:
            return Answer(Next.CONFIRM, candidates=tuple(found), handed_on=handed)
        found = [t for t in found if t.uid in known.confirmed]
    target = chosen(found)
    if target is not None:
        return Answer(Next.SERVE, target=target, handed_on=handed)
    listed = ", ".join(f"{p.namespace}/{p.name}" for p in looked.pods) or "none"
    narrowed = "" if looked.kubelet is None else " kubelet is admitting none of them;"
    return Answer(Next.LOOK, candidates=tuple(found), handed_on=handed,
                  seen=f"pending Pods listed: {listed};{narrowed} claimed ones excluded")


# The waits for a change while nothing fits: a change (a claim removed, an instance destroyed)
# ends one early; the ceiling doubles from 0.2 s to 4 s, never past the deadline.
ROOM_WAIT = backoff.Schedule(base=0.2, cap=4.0)


class Step(Enum):
    READ_FRESH = "plan again on a fresh read"
    MAKE_ROOM = "make room, then plan again"
    PLAN_AGAIN = "plan again at once"
    WAIT = "wait for a change, then plan again"
    REFUSE = "refuse: no room by the deadline"


def after_miss(
    *, placed: bool, fresh: bool, attempt: int, made_room_at: int, remaining: float,
    room_failed: bool = False,
) -> Step:
    """What follows a plan that wrote no claims.

    `placed`: the plan found spots (another writer took them before the claims were written);
    `fresh`: it was made on a fresh read, not the views; `attempt`: the number of this miss among
    those on fresh reads (1 for the first); `made_room_at`: the attempt after which room was last
    made (0: never); `remaining`: seconds to the Allocate's deadline; `room_failed`: room was just
    tried for this attempt and none was made.

    A plan on the views that finds no room is made again on a fresh read. Room is made at once
    after a miss, but not twice in a row: a reclaimer that says "destroyed" while the room stays
    taken must not be asked in a tight loop. Spots lost to another writer are planned again at
    once; no spots, waited for.
    """
    if not placed and not fresh:
        return Step.READ_FRESH
    if not placed and not room_failed and remaining > 0 and made_room_at != attempt - 1:
        return Step.MAKE_ROOM
    if remaining <= 0:
        return Step.REFUSE
    return Step.PLAN_AGAIN if placed else Step.WAIT


def _reclaimable(claim: Claim, snap: Snapshot) -> bool:
    """The one definition `reclaim.now` applies too (partkeeper.podstate)."""
    return reclaimable_now(claim, pod_dead=snap.is_dead(claim.pod_uid), now=snap.read_at)


def _looks_live(claim: Claim, snap: Snapshot) -> bool:
    return claim.state != "releasing" and not snap.is_dead(claim.pod_uid)


def _relevant(offer: Offer, snap: Snapshot) -> list[Claim]:
    return [c for c in snap.claims if c.kind == offer.kind and c.card in offer.legal]


def reclaim_plan(offer: Offer, snap: Snapshot, count: int) -> list[Claim] | None:
    """The dead holders to destroy so that `count` instances of the offer fit; None if no plan."""
    dead = {c.id: c for c in _relevant(offer, snap) if _reclaimable(c, snap)}
    theirs: dict[tuple[int, int], str] = {}  # (card, GI id) of an instance -> its dead claim
    for card in snap.docs:
        inv = snap.inventory(card)
        for claim_id, inst in (*inv.owned.items(), *inv.unrecorded.items()):
            if claim_id in dead:
                theirs[(card, inst.gi_id)] = claim_id
    claims = [c for c in snap.claims if c.id not in dead]
    instances = [i for i in snap.all_instances if (i.card, i.gi_id) not in theirs]
    spots = place(offer.legal, claims, instances, kind=offer.kind, count=count,
                  failed=snap.failed)
    if spots is None:
        return None
    hit: set[str] = set()
    for claim in dead.values():
        if _covers(spots, claim.card, (claim.start, claim.size)):
            hit.add(claim.id)
    for inst in snap.all_instances:
        owner = theirs.get((inst.card, inst.gi_id))
        if owner is not None and _covers(spots, inst.card, inst.placement):
            hit.add(owner)
    return [dead[i] for i in sorted(hit)]


def _covers(spots: Sequence[Spot], card: int, rng: tuple[int, int]) -> bool:
    return any(s.card == card and overlaps(s.range, rng) for s in spots)


def suspects(offer: Offer, snap: Snapshot) -> list[str]:
    """Pods holding room the offer could use that look live: worth a fresh question."""
    return sorted({c.pod_uid for c in _relevant(offer, snap) if _looks_live(c, snap)})


def describe(
    offer: Offer, snap: Snapshot, count: int, node: str, waited: float, target: object = None
) -> str:
    """One sentence: what is full, for whom, and what holds it."""
    holders: list[str] = []
    for card in offer.cards:
        info = snap.cards.get(card)
        model = f" ({info.model})" if info is not None else ""
        if card in snap.failed:
            fault = snap.health.card_fault(card)
            why = fault.meaning if fault is not None else "the card stopped answering"
            holders.append(f"card {card}{model} has failed ({why}) and takes no new partition")
            continue
        parts = [_claim_text(c, snap) for c in snap.claims
                 if c.card == card and c.kind == offer.kind]
        doc = snap.docs.get(card)
        if doc is not None and offer.kind == "partition":
            inv = snap.inventory(card)
            parts += [f"a foreign {i.profile} at slices {_span(i.start, i.size)} ({i.uuid})"
                      for i in inv.foreign]
        holders.append(f"card {card}{model} holds " + ("; ".join(parts) or "nothing we can see"))
    what = "slice" if offer.kind == "slice" else f"{offer.profile} partition"
    whom = f" for {target}" if target is not None else ""
    return (
        f"no room for {count} {what}(s) of {offer.resource}{whom} on node {node} after waiting "
        f"{waited:.0f}s: " + ". ".join(holders) + "." + _mix(offer, snap) + " Nothing was claimed."
    )


def _mix(offer: Offer, snap: Snapshot) -> str:
    """Profiles share a card's memory slices, and kubelet counts each profile's tokens apart: it
    admits Pods whose mix of profiles cannot fit on the card together (7 x 1g and 1 x 7g are all
    Healthy on an empty card). Say so when live partitions of other profiles are what is in the
    way; only partitionable-device DRA removes the over-admission."""
    if offer.kind != "partition":
        return ""
    others = sorted({c.profile for c in _relevant(offer, snap)
                     if c.profile != offer.profile and _looks_live(c, snap)})
    if not others:
        return ""
    return (f" The profile mix cannot fit on the card: {offer.profile} needs memory slices that "
            f"live {', '.join(others)} partitions hold, though kubelet saw Healthy tokens of "
            "each; this Pod can run once they end.")


def _claim_text(claim: Claim, snap: Snapshot) -> str:
    pod = "confirmed finished or gone" if snap.is_dead(claim.pod_uid) else "live"
    return (
        f"{claim.profile} at slices {_span(claim.start, claim.size)} for Pod {claim.namespace}/"
        f"{claim.name} ({claim.pod_uid}, {pod}; claim {claim.id} {claim.state})"
    )


def _span(start: int, size: int) -> str:
    return str(start) if size == 1 else f"{start}-{start + size - 1}"
