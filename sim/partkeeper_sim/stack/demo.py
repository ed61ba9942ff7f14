"""`partkeeper up --demo`: a scripted scenario on the embedded stack (docs/demo.md).

Everything goes through the same doors a cluster user and an operator would use: Pods through the
real `kubernetes` client against the simulated API server, partitions carved or held busy through
the simulated driver, and what partkeeper reports through `partkeeper status` (NATS only). Each
step waits on what it expects with a deadline, and says what did not happen and which log to read
when the deadline passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from partkeeper.drivers.base import Instance
from partkeeper.status import limiter_line
from partkeeper_sim.stack.kube import Kube, PodWatch, health_line, health_words
from partkeeper_sim.stack.launch import Stack
from partkeeper_sim.stack.observe import DemoError, Observer, PodTrack, woken_or_timeout
from partkeeper_sim.stack.probe import Probe
from partkeeper_sim.stack.scheduling import Scheduler, require
from partkeeper_sim.stack.table import View
from schemas import Claim

# The node is filled exactly: three 3g.40gb take card 0 and the back half of card 1 (a hand-carved
# 1g.10gb sits at slice 0 of card 1), then a 2g.20gb and a 1g.10gb take what is left of card 1,
# and four Pods take the sliced card's four slices. Every refill then needs its predecessor's room.
FILL = (("3g.40gb", 3), ("2g.20gb", 1), ("1g.10gb", 1))
SLICE_PODS = 4
FOREIGN_CARD, FOREIGN_PROFILE = 1, "1g.10gb"
REFILLS = ("3g.40gb", "2g.20gb", "1g.10gb", None)  # None: the logical-slice resource
BUSY_PROFILE = "3g.40gb"
FAILING_XID = 48  # a double-bit ECC error: fatal for the card, which keeps answering
STEP_SECONDS = 45.0
RECHECK_SECONDS = 1.0


@dataclass(slots=True)
class BusyResult:
    pod: str
    instance: str
    refused_attempts: int = 0
    held_seconds: float = 0.0
    destroyed_after_release: float | None = None


@dataclass(slots=True)
class Outcome:
    pods: list[PodTrack]
    foreign_seen: int
    busy: BusyResult | None
    leaks: list[str]
    error: str | None
    seconds: float
    slices: str = ""  # whether the logical slices were enforced, as status said
    failed_card: str = ""  # what the card-failure step showed

    @property
    def refused(self) -> list[PodTrack]:
        return [p for p in self.pods if p.refused]

    @property
    def passed(self) -> bool:
        return self.error is None and not self.refused and not self.leaks


@dataclass(slots=True)
class Demo:
    stack: Stack
    probe: Probe
    kube: Kube
    observer: Observer
    scheduler: Scheduler
    view: View
    foreign: Instance | None = None
    slices: str = ""  # status's line on slice enforcement
    busy: BusyResult | None = None
    failed_card: str = ""  # what the card-failure step saw, for the summary
    leaks: list[str] = field(default_factory=list)
    _serial: count[int] = field(default_factory=lambda: count(1))

    def resource(self, profile: str | None) -> str:
        config = self.stack.config
        return config.sliced_resource if profile is None else config.resource_prefix + profile

    def kind(self, resource: str) -> str:
        return "slice" if resource == self.stack.config.sliced_resource else "partition"

    def name(self, profile: str | None, role: str = "pod") -> str:
        short = "slice" if profile is None else profile.split(".")[0]
        return f"{role}-{short}-{next(self._serial)}"

    def running(self, resource: str) -> list[PodTrack]:
        return [p for p in self.observer.pods.values()
                if p.resource == resource and p.running and p.deleted is None]

    async def until(self, check: Callable[[], Awaitable[object]], what: str, hint: str,
                    timeout: float = STEP_SECONDS) -> object:
        return await self.observer.wakeups.until(check, timeout=timeout, what=what, hint=hint)


async def check_empty(demo: Demo) -> None:
    """The scenario counts on empty cards: a reused --workdir must have been left clean."""
    left = await demo.probe.instances()
    claims = await demo.probe.claims()
    require(not left and not claims,
            f"the demo needs empty cards, and {demo.stack.layout.cluster.sim_state} holds "
            f"{len(left)} instance(s) and {len(claims)} claim(s); use a fresh --workdir")
    demo.slices = limiter_line((await demo.probe.status()).get("slice_limiter"))
    demo.view.note(demo.slices)


async def carve_foreign(demo: Demo) -> None:
    """An operator carves a partition by hand: reported, counted occupied, left alone."""
    demo.foreign = inst = await demo.probe.carve(FOREIGN_CARD, FOREIGN_PROFILE)
    demo.view.note(f"carved {inst.profile} by hand on card {inst.card} ({inst.uuid})")

    async def reported() -> bool:
        status = await demo.probe.status()
        card = status["cards"][FOREIGN_CARD]
        flagged = any(i["uuid"] == inst.uuid and i["foreign"] for i in card["instances"])
        # An empty H100 offers seven 1g.10gb; one fewer means the carve is counted occupied.
        occupied = card["free"].get(FOREIGN_PROFILE) == 6
        return flagged and occupied and inst.uuid in demo.observer.foreign_seen

    await demo.until(reported, f"the hand-carved {inst.uuid} reported as foreign",
                     "see logs/allocator.log (capacity) and logs/reclaimer.log (ForeignFound)")
    demo.view.note("the foreign instance is reported and counted occupied")


async def fill(demo: Demo) -> None:
    """Pods of several profiles and logical slices, admitted one after another."""
    plan = [(p, n) for p, n in FILL] + [(None, SLICE_PODS)]
    for profile, number in plan:
        resource = demo.resource(profile)
        for _ in range(number):
            pod = await demo.scheduler.run(demo.name(profile), resource, demo.kind(resource))
            require(not pod.refused, f"Pod {pod.name} was refused: {pod.refused}")
            await _learn_instance(demo, pod)
            demo.view.note(f"{pod.name} running on {pod.instance or 'a logical slice'}")


async def _learn_instance(demo: Demo, pod: PodTrack) -> None:
    """Wait for the Pod's claim to be active (and learn its partition's MIG UUID)."""

    async def active() -> bool:
        claims = [c for c in await demo.probe.claims() if c.pod_uid == pod.uid]
        if not claims or any(c.state != "active" for c in claims):
            return False
        instance = claims[0].instance
        pod.instance = instance.uuid if instance else ""
        return pod.kind == "slice" or bool(pod.instance)

    await demo.until(active, f"an active claim for Pod {pod.name}", "see logs/allocator.log")


async def refill(demo: Demo) -> None:
    """Delete a Pod and at once create another of the same profile: the reclaim window."""
    for profile in REFILLS:
        resource = demo.resource(profile)
        victim = demo.running(resource)[0]
        await demo.scheduler.delete(victim)
        successor = await demo.scheduler.create(demo.name(profile, "refill"), resource,
                                                demo.kind(resource))
        successor.refill_of = victim.name
        demo.view.note(f"deleted {victim.name}; created {successor.name} at once")
        await demo.scheduler.schedule(successor)
        require(not successor.refused, f"refill {successor.name} was refused: "
                f"{successor.refused}")
        await _learn_instance(demo, successor)
        waited = (successor.running or 0) - successor.created
        same = " (same MIG UUID: the successor reproduces it)" \
            if successor.instance and successor.instance == victim.instance else ""
        demo.view.note(f"{successor.name} admitted {waited:.2f}s after creation{same}")
        await demo.view.pause()


async def busy_instance(demo: Demo) -> None:
    """A process holds a partition while its Pod is deleted: no destroy until it lets go."""
    victim = demo.running(demo.resource(BUSY_PROFILE))[0]
    demo.busy = result = BusyResult(victim.name, victim.instance)
    await demo.probe.set_busy(victim.instance, True)
    await demo.scheduler.delete(victim)
    demo.view.note(f"{victim.instance} held busy; deleted {victim.name}")

    async def refused_while_busy() -> bool:
        claims = [c for c in await demo.probe.claims() if c.pod_uid == victim.uid]
        if victim.gone is None or not claims or claims[0].state != "releasing":
            return False
        result.refused_attempts = claims[0].release_attempts
        return result.refused_attempts >= 1 and victim.instance in await demo.probe.instances()

    await demo.until(refused_while_busy, f"a refused destroy of busy {victim.instance}",
                     "see logs/reclaimer.log and logs/watcher.log")
    require(victim.reclaimed is None, f"{victim.instance} was destroyed while busy")
    demo.view.note(f"destroy refused while busy; {victim.instance} kept, claim releasing")
    await demo.view.pause()
    await refused_while_busy()  # the count of refused attempts up to the release
    await demo.probe.set_busy(victim.instance, False)
    victim.busy_released = time.monotonic()
    result.held_seconds = victim.busy_released - (victim.deleted or victim.busy_released)
    demo.view.note(f"released after {result.refused_attempts} refused destroy(s)")

    async def reclaimed() -> bool:
        return victim.reclaimed is not None

    await demo.until(reclaimed, f"the reclaim of {victim.instance} once released",
                     "see logs/reclaimer.log")
    result.destroyed_after_release = (victim.reclaimed or 0) - victim.busy_released
    demo.view.note(f"{victim.instance} destroyed {result.destroyed_after_release:.2f}s "
                   "after release")


async def card_fails(demo: Demo) -> None:
    """A card reports a fatal XID mid-run: it takes nothing new, the Pods on it are told with a
    Warning Event, their partitions are left alone, and the other card still admits."""
    # Fail a card that holds demo Pods while another still has room for the next one. The busy
    # step ends when the partition is gone from the cards; the capacity status reports follows
    # the claim's removal a moment later, so the room is waited for, never read once.
    picked: dict[str, dict[str, Any]] = {}

    async def room() -> bool:
        cards = [c for c in (await demo.probe.status())["cards"] if c["mode"] == "partition"]
        roomy = [c for c in cards if c["free"].get(BUSY_PROFILE, 0) > 0]
        others = [c for c in cards if roomy and c["index"] != roomy[0]["index"]]
        if not others:
            return False
        picked.update(healthy=roomy[0], failing=others[0])
        return True

    await demo.until(room, f"a card with room for a {BUSY_PROFILE} after the busy step",
                     "see logs/allocator.log (capacity) and logs/reclaimer.log")
    healthy, failing = picked["healthy"], picked["failing"]
    on_it = {i["claim"]["pod_uid"] for i in failing["instances"] if i.get("claim")}
    claims_before = {c.id: c for c in await demo.probe.claims() if c.card == failing["index"]}
    await demo.probe.fail_card(failing["index"], FAILING_XID)
    demo.view.note(f"card {failing['index']} reports XID {FAILING_XID} "
                   f"(`partkeeper sim fail --card {failing['index']} --xid {FAILING_XID}`)")

    async def taken_out() -> bool:
        card = (await demo.probe.status())["cards"][failing["index"]]
        return card.get("health") == "failed" and not any(card["free"].values())

    await demo.until(taken_out, f"card {failing['index']} shown failed, offering nothing",
                     "see logs/allocator.log (card health)")
    key = f"partkeeper.io/card-{failing['index']}-health"

    async def noted() -> bool:
        return (await demo.kube.annotations()).get(key, "").startswith("failed: xid-")

    await demo.until(noted, f"the Node annotation {key}", "see logs/watcher.log")
    names = {p.uid: p.name for p in demo.observer.pods.values()}
    told = {names.get(uid, uid) for uid in on_it}

    async def pods_told() -> bool:
        warned = {e["involvedObject"]["name"] for e in await demo.kube.warnings(
            "PartitionCardUnhealthy")}
        return told <= warned

    await demo.until(pods_told, f"a PartitionCardUnhealthy Event on {', '.join(sorted(told))}",
                     "see logs/allocator.log and logs/watcher.log")
    demo.view.note(f"told {len(told)} Pod(s) on card {failing['index']} "
                   "(Warning PartitionCardUnhealthy)")
    shown = await _health_shown(demo, sorted(told), "Unhealthy", failing["index"])
    demo.view.note(f"their own status says so: {shown}")
    pod = await demo.scheduler.run(demo.name(BUSY_PROFILE, "after-fail"),
                                   demo.resource(BUSY_PROFILE), "partition")
    require(not pod.refused, f"Pod {pod.name} was refused with a healthy card left: "
            f"{pod.refused}")
    await _learn_instance(demo, pod)
    [claim] = [c for c in await demo.probe.claims() if c.pod_uid == pod.uid]
    require(claim.card == healthy["index"], f"{pod.name} was placed on card {claim.card}, "
            f"which has failed")
    after = {c.id: c for c in await demo.probe.claims() if c.card == failing["index"]}
    require(after.keys() == claims_before.keys() and all(
        c.state == claims_before[i].state for i, c in after.items()),
        "a claim on the failed card changed: a health event must release nothing")
    demo.view.note(f"{pod.name} admitted on card {claim.card}; the failed card's "
                   f"{len(after)} claim(s) untouched")
    await demo.probe.recover_card(failing["index"])

    async def offered_again() -> bool:
        card = (await demo.probe.status())["cards"][failing["index"]]
        return card.get("health") == "ok" and key not in await demo.kube.annotations()

    await demo.until(offered_again, f"card {failing['index']} offered again after the reset",
                     "see logs/allocator.log (card health)")
    await _health_shown(demo, sorted(told), "Healthy", failing["index"])
    demo.failed_card = (f"card {failing['index']} failed (XID {FAILING_XID}): {len(told)} Pod(s) "
                        f"told and shown Unhealthy in their status, {pod.name} admitted on card "
                        f"{claim.card}, nothing released; recovered and shown Healthy")
    demo.view.note(f"card {failing['index']} reset (`partkeeper sim recover`) and offered again")


async def _health_shown(demo: Demo, names: list[str], word: str, card: int) -> str:
    """Wait until every named Pod's allocatedResourcesStatus says `word` of all its devices
    (the simulated kubelet writes it from the plugin's ListAndWatch); one Pod's line."""

    seen: dict[str, str] = {}

    async def every() -> str:
        ok = True
        for name in names:
            entries = await demo.kube.resource_health(name)
            seen[name] = health_line(name, entries)
            ok = ok and health_words(entries) == {word}
        return (seen[names[0]] if names else "no Pod on the card") if ok else ""

    try:
        shown = await demo.until(every, f"{word} in the status of the Pods on card {card}",
                                 "see logs/cluster.log (kubelet) and logs/allocator.log")
    except DemoError as exc:
        raise DemoError(f"{exc}; last seen: {' | '.join(seen.values())}") from None
    return str(shown)


async def drain(demo: Demo) -> None:
    """Delete every demo Pod; each partition and slice claim must be reclaimed."""
    left = [p for p in demo.observer.pods.values() if p.deleted is None]
    await asyncio.gather(*(demo.scheduler.delete(p) for p in left))
    demo.view.note(f"deleted the remaining {len(left)} Pods")

    foreign = {demo.foreign.uuid} if demo.foreign else set()

    async def clean() -> bool:
        # The claim goes a moment after its partition: wait for both, not for the first.
        if any(p.reclaimed is None for p in demo.observer.pods.values() if p.running):
            return False
        return not await demo.probe.claims() and set(await demo.probe.instances()) <= foreign

    try:
        await demo.until(clean, "the reclaim of every deleted Pod's partition and claim",
                         "see logs/reclaimer.log and logs/watcher.log")
    except DemoError as exc:
        demo.view.note(str(exc))  # the next step lists exactly what is left


async def verify(demo: Demo) -> None:
    """Nothing leaked: no claim, no instance but the foreign one, and status agrees."""
    foreign = demo.foreign.uuid if demo.foreign else ""
    claims = await demo.probe.claims()
    extra = sorted(set(await demo.probe.instances()) - {foreign})
    status = await demo.probe.status()
    reported = {i["uuid"]: i for card in status["cards"] for i in card["instances"]}
    demo.slices = limiter_line(status.get("slice_limiter"))
    demo.leaks += [f"claim {c.id} ({c.state}) of Pod {c.namespace}/{c.name}" for c in claims]
    demo.leaks += [f"instance {uuid} left on the cards" for uuid in extra]
    if foreign and not reported.get(foreign, {}).get("foreign"):
        demo.leaks.append(f"the foreign {foreign} is not reported as foreign by status")
    if demo.foreign and foreign in await demo.probe.instances():
        # The operator removes what they carved, so the same --workdir can run the demo again.
        await demo.probe.destroy(demo.foreign)
        demo.view.note(f"the operator removed the hand-carved {foreign}")


STEPS: tuple[tuple[str, Callable[[Demo], Awaitable[None]]], ...] = (
    ("check the cards are empty", check_empty),
    ("carve a partition by hand (foreign)", carve_foreign),
    ("fill the node: partitions and slices", fill),
    ("delete and refill at once (the reclaim window)", refill),
    ("delete a Pod whose partition is busy", busy_instance),
    ("a card fails mid-run; the other keeps admitting", card_fails),
    ("delete every demo Pod", drain),
    ("check nothing leaked", verify),
)


async def run(stack: Stack, view: View) -> Outcome:
    started = time.monotonic()
    kube = Kube(stack.kubeconfig, stack.node)
    observer = Observer(stack.nc, stack.node)
    probe = Probe(stack)
    demo = Demo(stack, probe, kube, observer, Scheduler(kube, observer, stack.nc,
                stack.layout.cluster.pod_resources_socket), view)
    watch = PodWatch(kube, observer.on_pod)
    error: str | None = None
    title = "start"
    await observer.start()
    watch.start()
    tracker = asyncio.create_task(track_reclaims(demo), name="demo reclaim tracker")
    await view.start(probe, observer, len(STEPS))
    try:
        for index, (title, step) in enumerate(STEPS, 1):
            view.step(index, title)
            await step(demo)
            await view.pause()
    except DemoError as exc:
        error = str(exc)
    except Exception as exc:  # reported in the summary with the step it broke
        error = f"{type(exc).__name__} during '{title}': {exc}"
    finally:
        tracker.cancel()
        await asyncio.gather(tracker, return_exceptions=True)
        await view.stop()
        await watch.stop()
        await observer.stop()
        kube.close()
    return Outcome(list(observer.pods.values()), len(observer.foreign_seen), demo.busy,
                   demo.leaks, error, time.monotonic() - started, demo.slices,
                   demo.failed_card)


async def track_reclaims(demo: Demo) -> None:
    """Stamp each deleted Pod when its partition is gone from the cards (a slice: its claim)."""
    with demo.observer.wakeups.listen() as woken:
        while True:
            woken.clear()
            pending = [p for p in demo.observer.pods.values()
                       if p.deleted and p.running and p.reclaimed is None]
            if pending:
                try:
                    _stamp(pending, await demo.probe.instances(), await demo.probe.claims(),
                           demo.observer.claim_removed)
                except Exception as exc:  # a failed read stamps nothing; the next wake retries
                    demo.view.note(f"reading the cards or claims failed: {exc}")
                if any(p.reclaimed is not None for p in pending):
                    demo.observer.wakeups.touch()
            await woken_or_timeout(woken, RECHECK_SECONDS)


def _stamp(pending: list[PodTrack], instances: Mapping[str, object], claims: list[Claim],
           removed: dict[str, float]) -> None:
    """A partition's MIG UUID returns when a successor takes the same slot, so the claim's
    removal (which follows the confirmed destroy) also counts as evidence, at the time its
    audit event arrived."""
    holders = {c.pod_uid for c in claims}
    now = time.monotonic()
    for pod in pending:
        absent = pod.kind == "partition" and pod.instance not in instances
        if absent or pod.uid not in holders:
            pod.reclaimed = min(now, removed.get(pod.uid, now))
