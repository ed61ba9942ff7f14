"""The Allocate flow (docs/contract.md section 5), one container request at a time.

    read the claims -> ask `decide.which_pod`, gathering what it asks for, until it answers:
      RESUME -> the same partition(s), completing `creating` claims left by a crash (and writing
                the ones a crash kept it from writing), re-making those a host reboot removed
                (`core.remake`)
      SERVE  -> plan (making room if needed) -> write the claims as `creating` -> create ->
                `active` -> descriptors -> reply

This module is the shell: it reads (`state`), asks (`podmatch`), and acts (`writes`, `handoff`,
`plugin`'s builders); what to do is decided by the pure functions of `decide.py` and
`placement.py`. A retry is recognised only for the Pod it belongs to (`decide.holder`); device
IDs kubelet handed on from a stopped Pod start a new allocation for the Pod kubelet is admitting.
One claim's partition is never returned to another Pod. See docs/allocator.md, "Which Pod an
Allocate serves".

Every wait of an Allocate (the claims store, the watcher, room) ends by one deadline, `until`,
set in `_allocate`: `Options.room_wait_seconds` after the call came.

Once claims are written, their realisation runs to the end even if kubelet gives up on the call,
so a kubelet retry finds them active (or abandoned) rather than half-made. Waiting for room
honours cancellation: nothing is written while waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from opentelemetry import trace

from partkeeper import backoff, faults
from partkeeper.kubelet import deviceplugin_pb2 as pb
from partkeeper.lifecycle import woken_or_timeout
from partkeeper.telemetry import metrics, tracing
from partkeeper.telemetry.logs import decision
from partkeeper.workdir import WorkdirError, write_descriptor
from schemas import Claim, encode
from services.allocator.core import events, handoff, remake, sliced, state, writes
from services.allocator.core.catalog import Offer
from services.allocator.core.placement import Snapshot, Spot, Target, place
from services.allocator.core.refusal import Refusal, Result
from services.allocator.core.state import ClaimsRead, Context, SnapshotError, read, read_claims
from services.allocator.deviceplugin import decide, plugin, podmatch, room
from services.allocator.deviceplugin.podmatch import PodResources

log = logging.getLogger(__name__)
_tracer = tracing.tracer(__name__)

PLAN_ATTEMPTS = 3  # plans in a row whose placement the driver found taken before refusing


class Allocator:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.kubelet = PodResources(ctx.config.pod_resources_socket)
        self._calls: set[asyncio.Task[pb.ContainerAllocateResponse]] = set()
        self._work: dict[str, asyncio.Task[list[Claim]]] = {}  # claim id -> its realisation
        self._serving: set[tuple[str, str, str]] = set()  # (uid, container, resource) in flight
        self._choosing = asyncio.Lock()
        self._closing = False

    async def allocate(
        self, offer: Offer, device_ids: Sequence[str]
    ) -> pb.ContainerAllocateResponse:
        """Serve one container request. Runs in a task of ours, so that `close` can end it;
        cancelling the caller (kubelet gave up) cancels it too."""
        if self._closing:
            raise Refusal(Result.UNAVAILABLE, "the allocator is stopping; kubelet may retry")
        call = asyncio.create_task(self._measured(offer, device_ids), name="allocate")
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)
        return await call

    async def _measured(
        self, offer: Offer, device_ids: Sequence[str]
    ) -> pb.ContainerAllocateResponse:
        started = time.perf_counter()
        label = "error"
        with self.ctx.serving():
            try:
                response, label = await self._allocate(offer, device_ids)
                return response
            except Refusal as exc:
                label = exc.result.label
                decision(log, f"Allocate refused: {exc.message}", resource=offer.resource,
                         device_ids=",".join(device_ids),
                         pod_uid=exc.pod[0] if exc.pod else None)
                await events.allocate_refused(self.ctx.js, self.ctx.node, offer.resource,
                                              device_ids, exc.message, exc.pod)
                raise
            except asyncio.CancelledError:
                label = "cancelled"
                raise
            finally:
                metrics.ALLOCATIONS.labels(offer.resource, label).inc()
                metrics.ALLOCATE_SECONDS.labels(offer.resource).observe(
                    time.perf_counter() - started)
                self.ctx.changes.touch()

    async def close(self) -> None:
        """Stop taking calls, end the ones waiting, and let realisations already started finish
        (they leave the store consistent: claims active, or abandoned)."""
        self._closing = True
        calls = set(self._calls)
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        pending = set(self._work.values())
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        await self.kubelet.close()

    async def _allocate(
        self, offer: Offer, device_ids: Sequence[str]
    ) -> tuple[pb.ContainerAllocateResponse, str]:
        # The one deadline: every wait of this Allocate (the claims store, the watcher, room)
        # ends by it.
        until = asyncio.get_running_loop().time() + self.ctx.options.room_wait_seconds
        ids = _checked(offer, device_ids)
        # One decision at a time in this process, so two concurrent Allocates never pick the
        # same container before either has written its claim (kubelet admits one at a time).
        async with self._choosing:
            answer, known = await self._which_pod(offer, ids, until)
            if answer.next is decide.Next.RESUME:
                group = list(answer.group)
            else:
                target = self._serve(offer, answer.target)
        if answer.next is decide.Next.RESUME:
            first = group[0]
            _tag(trace.get_current_span(), first.pod_uid, first.namespace, first.name,
                 first.container)
            try:
                return await self._resume(offer, group, ids, until), "retry"
            except Refusal as exc:
                exc.about(first.pod_uid, first.namespace, first.name)
                raise
        try:
            return await self._serve_target(offer, target, ids, known, until), "ok"
        except Refusal as exc:
            if answer.handed_on is not None and exc.result is Result.FULL:
                exc = Refusal(Result.FULL,
                              decide.handed_on(answer.handed_on, target, ids) + exc.message)
            raise exc.about(target.uid, target.namespace, target.name) from exc.__cause__
        finally:
            self._serving.discard((target.uid, target.container, offer.resource))

    async def _which_pod(
        self, offer: Offer, ids: list[str], until: float
    ) -> tuple[decide.Answer, ClaimsRead]:
        """Gather what `decide.which_pod` asks for until it says RESUME or SERVE; also the claims
        read it decided on, for the first plan. Held under `_choosing`."""
        serving = frozenset((uid, name) for uid, name, res in self._serving
                            if res == offer.resource)
        asked = decide.Asked(offer.resource, tuple(ids), serving)
        with _tracer.start_as_current_span("claims read"):
            known = await self._claims(until, views=True)
        gathered = decide.Gathered(tuple(known.claims), known.fresh)
        while True:  # each answer adds what was asked for; none is asked twice
            answer = decide.which_pod(asked, gathered)
            if answer.next is decide.Next.READ_FRESH:
                with _tracer.start_as_current_span("claims read"):
                    known = await self._claims(until)
                gathered = decide.Gathered(tuple(known.claims), fresh=True)
            elif answer.next is decide.Next.JUDGE:
                seen = await podmatch.holder(self.ctx, self.kubelet, answer.group, until)
                gathered = replace(gathered, holder=seen)
            elif answer.next in (decide.Next.LOOK, decide.Next.CONFIRM):
                return await self._look(asked, gathered, until), known
            else:
                return answer, known

    async def _look(
        self, asked: decide.Asked, gathered: decide.Gathered, until: float
    ) -> decide.Answer:
        """Look at the pending Pods until `decide.which_pod` names the container. The watcher
        may lag behind kubelet, so the lookup looks again, afresh, on the lookup policy's
        schedule: while no candidate is seen, for the policy's attempts; while the watcher gives
        no usable answer, until the deadline; while several remain after confirmation, for up to
        `choose_wait_seconds`, then refuses rather than guesses. Never past `until`."""
        resource, quantity = asked.resource, len(asked.ids)
        choose_until = min(until, asyncio.get_running_loop().time() +
                           self.ctx.options.choose_wait_seconds)
        policy = self.ctx.options.lookup
        looks = 0
        answer = decide.Answer(decide.Next.LOOK)

        async def look() -> decide.Answer | backoff.Again:
            nonlocal looks, gathered, answer
            looks += 1
            looked = await podmatch.look(self.ctx, self.kubelet, resource, quantity,
                                         fresh=looks > 1)
            gathered = replace(gathered, looked=looked, confirmed=None)
            answer = decide.which_pod(asked, gathered)
            if answer.next is decide.Next.CONFIRM:
                confirmed = await podmatch.confirm(self.ctx, answer.candidates)
                gathered = replace(gathered, confirmed=confirmed)
                answer = decide.which_pod(asked, gathered)
            if answer.next is decide.Next.SERVE:
                return answer
            if not looked.answered:
                return backoff.Again(answer.seen, until=until)
            return backoff.Again(answer.seen, until=choose_until if answer.candidates else None)

        attributes: dict[str, str | int] = {"pk.resource": resource, "pk.quantity": quantity}
        # The watcher's `serve pods-pending` is this span's child: the request carries it.
        with _tracer.start_as_current_span("pod lookup", attributes=attributes) as span:
            try:
                found = await backoff.retry(
                    f"finding the Pod an Allocate of {quantity} x {resource} serves", look,
                    transient=backoff.never, schedule=policy.delay, attempts=policy.attempts,
                    deadline=until, level=logging.INFO)
            except backoff.GaveUp as exc:
                raise Refusal(Result.NO_POD, _no_pod(self.ctx.node, asked, answer, exc)) from exc
            if (target := found.target) is not None:
                _tag(span, target.uid, target.namespace, target.name, target.container)
        return found

    async def _serve_target(
        self, offer: Offer, target: Target, ids: list[str], known: ClaimsRead, until: float
    ) -> pb.ContainerAllocateResponse:
        """Plan, claim, create and activate for `target`; plan again when the driver finds the
        planned placement taken. The first plan uses the claims read to find the Pod."""
        for attempt in range(1, PLAN_ATTEMPTS + 1):
            written, revisions = await self.reserve(offer, target, ids, until,
                                                    known if attempt == 1 else None)
            await faults.reach("allocator.after_claim")
            try:
                active = await self._realise(offer, written, revisions, resume=False)
            except writes.Displaced as exc:
                if attempt == PLAN_ATTEMPTS:
                    raise Refusal(Result.UNAVAILABLE, f"the placement planned for {target} was "
                                  f"taken {attempt} times in a row ({exc}); nothing was "
                                  "claimed") from exc
                continue
            return await self._respond(offer, active)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _claims(self, until: float, *, views: bool = False) -> ClaimsRead:
        try:
            return await state.waiting(self.ctx, "reading the claims",
                                          lambda: read_claims(self.ctx, views=views), until)
        except SnapshotError as exc:
            raise Refusal(Result.UNAVAILABLE, f"{exc}; nothing was claimed") from exc

    async def carried(self, resource: str) -> frozenset[str]:
        """The tokens of `resource` some claim carries, read now; none when the store does not
        answer (GetPreferredAllocation is advice, and the Allocate itself checks again)."""
        try:
            known = await read_claims(self.ctx, views=True)
        except SnapshotError as exc:
            log.info("claims unreadable for GetPreferredAllocation (%s); no preference", exc)
            return frozenset()
        return frozenset(t for c in known.claims if c.resource == resource for t in c.device_ids)

    def _serve(self, offer: Offer, target: Target | None) -> Target:
        if target is None:
            raise AssertionError("which_pod answered SERVE without a target")
        self._serving.add((target.uid, target.container, offer.resource))
        _tag(trace.get_current_span(), target.uid, target.namespace, target.name,
             target.container)
        return target

    async def _snapshot(self, until: float, known: ClaimsRead | None = None) -> Snapshot:
        try:
            return await state.waiting(self.ctx, "reading the claims",
                                          lambda: read(self.ctx, known), until)
        except SnapshotError as exc:
            raise Refusal(Result.UNAVAILABLE, f"{exc}; nothing was claimed") from exc

    async def reserve(
        self, offer: Offer, target: Target, ids: list[str], until: float,
        known: ClaimsRead | None = None,
    ) -> tuple[list[Claim], writes.Revisions]:
        """Write `creating` claims for `ids`, making room or waiting for it until `until`.
        `known`: a claims read to plan the first attempt on, with the instances in the views
        (saves a round trip and a thread hop); a plan on the views that finds no room is made
        again on a fresh read before room is made or waited for. Returns the claims and the
        revisions their writes left, for the writes that follow."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        attempt = made_at = 0
        while True:
            change = self.ctx.changes.next_change()
            async with self.ctx.placing:
                with _tracer.start_as_current_span("snapshot"):  # the cards' instances, a hop
                    snap = await self._snapshot(until, known)
                known = None  # every later attempt reads afresh
                spots = place(offer.legal, snap.claims, snap.all_instances, kind=offer.kind,
                              count=len(ids), failed=snap.failed)
                if spots is not None:
                    revisions = writes.Revisions(snap.docs, snap.revisions)  # writes go against it
                    claims = await self._begin(offer, target, ids, spots, revisions)
                    if claims is not None:
                        return claims, revisions
            step = decide.after_miss(placed=spots is not None, fresh=snap.fresh,
                                    attempt=attempt + 1, made_room_at=made_at,
                                    remaining=until - loop.time())
            if step is decide.Step.READ_FRESH:
                continue
            attempt += 1
            if step is decide.Step.MAKE_ROOM:
                if await self._make_room(offer, ids, snap, attempt, until):
                    made_at = attempt
                    continue
                step = decide.after_miss(placed=False, fresh=True, attempt=attempt,
                                        made_room_at=made_at, remaining=until - loop.time(),
                                        room_failed=True)
            if step is decide.Step.REFUSE:
                waited = loop.time() - started
                raise Refusal(Result.FULL, decide.describe(offer, snap, len(ids), self.ctx.node,
                                                         waited, target))
            if step is decide.Step.WAIT:
                pause = min(until - loop.time(), decide.ROOM_WAIT(attempt))
                await woken_or_timeout(change, pause)

    async def _make_room(
        self, offer: Offer, ids: list[str], snap: Snapshot, attempt: int, until: float
    ) -> bool:
        try:
            async with asyncio.timeout_at(until):
                return await room.make(self.ctx, offer, len(ids), snap, attempt, until)
        except TimeoutError:
            return False

    async def _begin(
        self, offer: Offer, target: Target, ids: list[str], spots: list[Spot],
        revisions: writes.Revisions,
    ) -> list[Claim] | None:
        now = time.time()
        claims = [
            writes.new_claim(target, kind=offer.kind, resource=offer.resource, token=t,
                             card=s.card, profile=offer.profile, start=s.start, size=s.size,
                             now=now)
            for t, s in zip(ids, spots, strict=True)
        ]
        written: list[Claim] = []
        try:
            for claim in claims:
                if not await writes.begin(self.ctx, claim, revisions):
                    break
                written.append(claim)
            else:
                return written
        except Exception as exc:
            # The claim being written may have landed (writes.WriteUnknown): abandon it too.
            await self._abandon(claims[: len(written) + 1], f"writing the claims failed: {exc}",
                                revisions)
            raise Refusal(Result.UNAVAILABLE, f"claiming room for {target} failed: {exc}; "
                          "nothing was claimed") from exc
        await self._abandon(written, "placement lost to another writer; planning again",
                            revisions)
        return None

    async def _abandon(
        self, claims: list[Claim], reason: str, revisions: writes.Revisions
    ) -> None:
        for claim in claims:
            await writes.abandon(self.ctx, claim, reason, revisions)

    async def _realise(
        self, offer: Offer, claims: list[Claim], revisions: writes.Revisions | None, *,
        resume: bool,
    ) -> list[Claim]:
        """Create/activate in a task that outlives a cancelled call (see the module docstring)."""
        if offer.kind == "slice":
            work = sliced.realise(self.ctx, claims, revisions)
        else:
            work = writes.realise(self.ctx, claims, resume=resume, known=revisions)
        task = asyncio.create_task(work, name=f"realise {claims[0].id}")
        for claim in claims:
            self._work[claim.id] = task
        task.add_done_callback(lambda t: self._forget(t, claims))
        return await asyncio.shield(task)

    def _forget(self, task: asyncio.Task[list[Claim]], claims: list[Claim]) -> None:
        for claim in claims:
            if self._work.get(claim.id) is task:
                del self._work[claim.id]
        if not task.cancelled() and task.exception() is not None:
            log.debug("realisation of %s ended with %s", claims[0].id, task.exception())

    async def _resume(
        self, offer: Offer, group: list[Claim], ids: list[str], until: float
    ) -> pb.ContainerAllocateResponse:
        running = {self._work[c.id] for c in group if c.id in self._work}
        if running:
            await asyncio.gather(*(asyncio.shield(t) for t in running), return_exceptions=True)
            snap = await self._snapshot(until)
            group = decide.existing(snap.claims, offer.resource, _tokens(group))
            if not group:
                raise Refusal(Result.UNAVAILABLE, "the first attempt of this Allocate failed and "
                              "undid its claims; kubelet may retry")
        if any(c.rebooted for c in group):  # kubelet starts the container again after a reboot
            group = await remake.remake(self.ctx, group, offer.legal, until)
        extra = decide.missing(group, ids)
        revisions: writes.Revisions | None = None
        if extra:  # a crash came between the claim writes of this container
            first = group[0]
            owner = Target(first.pod_uid, first.namespace, first.name, first.container)
            decision(log, f"retried Allocate writes the claims for {','.join(extra)} a crash "
                     "left unwritten", pod_uid=first.pod_uid, card=first.card, claim_id=first.id)
            written, revisions = await self.reserve(offer, owner, extra, until)
            group = [*group, *written]
        creating = [c for c in group if c.state == "creating"]
        done = [c for c in group if c.state == "active"]
        if creating:
            first = creating[0]
            decision(log, "retried Allocate completes a creating claim", pod_uid=first.pod_uid,
                     card=first.card, claim_id=first.id)
            done += await self._realise(offer, creating, revisions, resume=True)
        return await self._respond(offer, done)

    async def _respond(self, offer: Offer, claims: list[Claim]) -> pb.ContainerAllocateResponse:
        claims = _in_token_order(claims, offer.tokens)
        if offer.kind == "slice":
            edits, names = await handoff.slice_handoff(self.ctx, claims)
            response = plugin.slice_response(edits, names)
        else:
            # The descriptors are written in the thread hop of the container edits: one hop
            # instead of two on every Allocate, the descriptors still first.
            with _tracer.start_as_current_span("container edits"):
                edits, cdi_names = await handoff.partition_handoff(
                    self.ctx, claims, first=lambda: self._write_descriptors(claims))
            response = plugin.partition_response(claims, edits, cdi_names)
        await faults.reach("allocator.after_active")
        return response

    def _write_descriptors(self, claims: list[Claim]) -> None:
        """Blocking: runs in the container edits' thread (`handoff.partition_handoff`)."""
        for claim in claims:
            body = encode(plugin.descriptor(claim, self.ctx.card(claim.card)))
            uuid = claim.instance.uuid if claim.instance else ""
            try:
                with _tracer.start_as_current_span(
                    "descriptor", attributes={**writes.span_attributes(claim),
                                              "pk.instance_uuid": uuid}
                ):
                    write_descriptor(self.ctx.config.pods_dir, claim.pod_uid, claim.container,
                                     uuid, body)
            except WorkdirError as exc:
                raise Refusal(Result.UNAVAILABLE, f"partition {uuid} of Pod {claim.namespace}/"
                              f"{claim.name} ({claim.pod_uid}) is made (claim {claim.id}, active) "
                              f"but its descriptor could not be written: {exc}") from exc


def _tag(span: trace.Span, uid: str, namespace: str, name: str, container: str) -> None:
    """Name the Pod an Allocate serves on its span: kubelet's call does not say."""
    span.set_attributes({"pk.pod_uid": uid, "pk.pod": f"{namespace}/{name}",
                         "pk.container": container})


def _tokens(claims: Sequence[Claim]) -> list[str]:
    return sorted({t for c in claims for t in c.device_ids})


def _checked(offer: Offer, device_ids: Sequence[str]) -> list[str]:
    ids = list(device_ids)
    unknown = [i for i in ids if i not in offer.tokens]
    if not ids or unknown or len(set(ids)) != len(ids):
        raise Refusal(Result.INVALID, f"Allocate for {offer.resource} named device IDs "
                      f"{','.join(ids) or '(none)'}; expected distinct IDs this plugin lists")
    if len(ids) > 1 and offer.one_per_container:
        # T-Head's and Hygon's runtimes make exactly one partition visible to a container.
        raise Refusal(Result.INVALID, f"Allocate for {offer.resource}: a container can use "
                      f"exactly one {'/'.join(offer.one_per_container)} partition and this one "
                      f"asked for {len(ids)}; request one partition per container")
    rank = {t: i for i, t in enumerate(offer.tokens)}
    return sorted(ids, key=rank.__getitem__)


def _in_token_order(claims: Sequence[Claim], tokens: Sequence[str]) -> list[Claim]:
    rank = {t: i for i, t in enumerate(tokens)}
    return sorted(claims, key=lambda c: min((rank.get(t, len(rank)) for t in c.device_ids),
                                            default=len(rank)))


def _no_pod(node: str, asked: decide.Asked, last: decide.Answer, gave_up: backoff.GaveUp) -> str:
    """Why no container was found: several left (never guessed between), or none."""
    quantity = len(asked.ids)
    if len(last.candidates) > 1:
        names = " and ".join(f"{t.namespace}/{t.name}" for t in last.candidates)
        return (
            f"an Allocate of {quantity} x {asked.resource} on node {node} could serve Pod "
            f"{names}, all pending and confirmed live, and kubelet's pod-resources API did not "
            "say which one it is admitting; refused rather than guessed, since a wrong guess "
            "hands one Pod's partition to another; kubelet may retry"
        )
    return (f"no pending Pod on node {node} waits for {quantity} x {asked.resource} "
            f"({gave_up.problem}), after {gave_up.attempts} attempts")
