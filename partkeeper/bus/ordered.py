"""The one ordered watch: an ephemeral push consumer created by name, re-created under a fresh
name whenever its delivery can no longer be trusted.

Why not nats-py's ordered consumer (`js.subscribe(ordered_consumer=True)`, which `kv.watch` uses):
it creates an unnamed consumer on `$JS.API.CONSUMER.CREATE.<stream>`, the filter only in the
request body, so no permission can say whose subjects it reads; and its reset
(`_JSI.reset_ordered_consumer` / `recreate_consumer` in nats/js/client.py) re-creates under the
same configuration, so naming the consumer there would collide with the old one. Here every
consumer is created on `$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`: nats-py's
`add_consumer` uses that form when the configuration has a name and a filter (server 2.9+), and
the server refuses a body whose filter differs from the subject's, or that adds
`filter_subjects` (nats-server server/jetstream_api.go, `jsConsumerCreateRequest`:
`JSConsumerCreateFilterSubjectMismatchError`, `JSConsumerMultipleFiltersNotAllowedError`). A
grant on `...CREATE.<stream>.*.<node's subjects>.>` therefore lets a service watch its node only.

What the three users rely on is kept: delivery in stream order to the connection's private inbox
(`nc.new_inbox()`), no acks, flow control answered, idle heartbeats, headers only where asked.
A reset (a gap in the consumer sequence, a heartbeat that says the server sent more than came,
no heartbeat for MISSED_HEARTBEATS intervals: the consumer deleted, the server restarted or the
connection lost) creates a new consumer, under a new name, starting at the stream sequence after
the last one handed out, so the reader sees neither a gap nor a duplicate.

No consumer is ever deleted by the watch: a reset or `stop` only drops the subscription, and the
server removes a consumer nobody listens to after `inactive` seconds (its `inactive_threshold`),
so a dead service leaves none behind. A delete grant would have to name the consumer with `*`,
which would let the service delete any consumer of the stream, other nodes' included.

The end of the initial replay (`None`, yielded once) is decided by the server's counts, never by a
separate look afterwards: the create reply carries the consumer's info as of its creation, before
any delivery (nats-server server/consumer.go: `setLeader` snapshots it, `initialInfo` answers it),
and each delivery carries the number of matching messages still pending after it. So the replay
is done when the create says nothing is pending, or at the first delivery that says so. (nats-py's
KV watch instead asks `consumer_info` after subscribing, when values already in flight are no
longer pending, which can make a full bucket look empty: bus/kv.py.)
"""

from __future__ import annotations

import logging
from types import TracebackType

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import api
from nats.nuid import NUID

from partkeeper import backoff

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
MISSED_HEARTBEATS = 3  # silence for this many heartbeat intervals means the consumer is gone
INACTIVE_SECONDS = 30.0  # the server removes a consumer nobody listens to after this long
# Deliveries a reader may fall behind by: nats-py drops what arrives beyond it (a slow consumer),
# which the watch sees as a gap in the consumer sequence and resets for, so memory stays bounded
# and nothing is lost.
PENDING_MESSAGES = 65_536

_CONTROL = api.StatusCode.CONTROL_MESSAGE  # "100": idle heartbeat or flow-control request


class OrderedWatch:
    """Messages of `filter_subject` on `stream`, in stream order, across consumer resets.

        async with OrderedWatch(nc, stream, subject) as watch:
            async for msg in watch:  # a Msg, or None once: the initial replay is complete
                ...
    """

    def __init__(
        self,
        nc: Client,
        stream: str,
        filter_subject: str,
        *,
        deliver: api.DeliverPolicy = api.DeliverPolicy.ALL,
        headers_only: bool = False,
        label: str = "pk-watch",
        heartbeat: float = HEARTBEAT_SECONDS,
        inactive: float = INACTIVE_SECONDS,
        pending: int = PENDING_MESSAGES,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.stream = stream
        self.filter_subject = filter_subject
        self.deliver = deliver
        self.headers_only = headers_only
        self.label = label
        self.heartbeat = heartbeat
        self.inactive = inactive
        self.pending = pending
        self.name: str | None = None  # the current consumer
        self.last_stream = 0  # stream sequence of the last message handed out
        self._positioned = False  # a reset resumes after last_stream, not by `deliver` again
        self.resets = 0
        self.caught_up = False
        self._announce = False
        self._next_consumer = 1
        self._sub: Subscription | None = None
        self._names = NUID()

    async def __aenter__(self) -> OrderedWatch:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    def __aiter__(self) -> OrderedWatch:
        return self

    async def __anext__(self) -> Msg | None:
        while True:
            if self._announce:
                self._announce = False
                return None
            if self._sub is None:
                await self._start()
                continue
            msg = await self._next(self._sub)
            if msg is not None:
                return msg

    async def stop(self) -> None:
        """Drop the subscription; the server removes the consumer after `inactive` seconds."""
        sub, self._sub = self._sub, None
        if sub is not None:
            await _unsubscribe(sub)

    async def _next(self, sub: Subscription) -> Msg | None:
        """The next data message, or None after handling a control message or a reset."""
        try:
            msg = await sub.next_msg(timeout=self.heartbeat * MISSED_HEARTBEATS)
        except nats.errors.TimeoutError:
            await self._reset(f"no heartbeat for {self.heartbeat * MISSED_HEARTBEATS:g}s")
            return None
        headers = msg.headers or {}
        status = headers.get(api.Header.STATUS)
        if status == _CONTROL:
            await self._control(msg, headers)
            return None
        if status:
            await self._reset(f"status {status} {headers.get(api.Header.DESCRIPTION, '')}")
            return None
        if not msg.reply.startswith("$JS.ACK."):  # not a delivery: nothing to hand out
            log.debug("watch %s: a message on its inbox that is no delivery; ignored", self.name)
            return None
        meta = msg.metadata
        if meta.sequence.consumer != self._next_consumer:
            await self._reset(f"consumer sequence {meta.sequence.consumer}, expected "
                              f"{self._next_consumer}")
            return None
        self._next_consumer += 1
        self.last_stream, self._positioned = meta.sequence.stream, True
        if not self.caught_up and meta.num_pending == 0:
            self._caught_up()
        return msg

    async def _control(self, msg: Msg, headers: dict[str, str]) -> None:
        if msg.reply:  # a flow-control request: everything before it has been handed out
            await self._answer(msg.reply)
            return
        stalled = headers.get(api.Header.CONSUMER_STALLED)
        if stalled:  # a heartbeat saying the server waits for a flow-control answer
            await self._answer(stalled)
        sent = headers.get(api.Header.LAST_CONSUMER)
        if sent is not None and int(sent) != self._next_consumer - 1:
            await self._reset(f"the server sent up to consumer sequence {sent}, "
                              f"{self._next_consumer - 1} arrived")

    async def _answer(self, subject: str) -> None:
        try:
            await self.nc.publish(subject, b"")
        except nats.errors.Error as exc:  # the server asks again; a reset follows if it stalls
            log.debug("flow-control answer on %s not sent: %s", self.stream, exc)

    def _caught_up(self) -> None:
        self.caught_up = True
        self._announce = True

    async def _reset(self, why: str) -> None:
        self.resets += 1
        log.info("watch %s of %s on %s reset (%s); resuming after stream sequence %d",
                 self.name, self.filter_subject, self.stream, why, self.last_stream)
        await self.stop()

    async def _start(self) -> None:
        """Create the next consumer, retrying with backoff until it exists; a connection closed
        for good (not reconnecting) ends the watch."""

        def transient(exc: Exception) -> bool:
            return isinstance(exc, TimeoutError | nats.errors.Error) and not self.nc.is_closed

        await backoff.retry(f"creating a watch of {self.filter_subject} on {self.stream}",
                            self._create, transient=transient, schedule=backoff.Schedule(cap=5.0))

    async def _create(self) -> None:
        name = f"{self.label}-{self._names.next().decode()}"
        inbox = self.nc.new_inbox()
        # Listening before the first delivery can come.
        sub = await self.nc.subscribe(inbox, pending_msgs_limit=self.pending)
        policy, start = self._start_at()
        config = api.ConsumerConfig(
            name=name,
            filter_subject=self.filter_subject,
            deliver_subject=inbox,
            ack_policy=api.AckPolicy.NONE,
            max_deliver=1,
            flow_control=True,
            idle_heartbeat=self.heartbeat,
            inactive_threshold=self.inactive,
            headers_only=self.headers_only or None,
            num_replicas=1,
            mem_storage=True,
            deliver_policy=policy,
            opt_start_seq=start,
        )
        try:
            info = await self.js.add_consumer(self.stream, config=config)
        except BaseException:
            await _unsubscribe(sub)
            raise
        self._sub, self.name, self._next_consumer = sub, name, 1
        if not self._positioned and self.deliver == api.DeliverPolicy.NEW:
            # What "new" meant: a later reset must resume here, not at the stream's end by then.
            self.last_stream = info.delivered.stream_seq if info.delivered else 0
            self._positioned = True
        if not self.caught_up and not info.num_pending:
            self._caught_up()

    def _start_at(self) -> tuple[api.DeliverPolicy, int | None]:
        if not self._positioned:
            return self.deliver, None
        return api.DeliverPolicy.BY_START_SEQUENCE, self.last_stream + 1


async def _unsubscribe(sub: Subscription) -> None:
    try:
        await sub.unsubscribe()
    except nats.errors.Error as exc:  # the connection is gone: so is the interest
        log.debug("unsubscribing a watch: %s", exc)
