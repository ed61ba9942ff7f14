"""The one durable pull-consumer runner: redelivery, ack/nak/term, dead letters, metrics, lag.

Handlers raise `Retry` for a temporary failure (nak with backoff) and `Permanent` for a message
that can never succeed (terminate and copy to PK_DLQ). A message that cannot be decoded is
permanent (schemas.codec: one SchemaError for every failure to decode, depth and size bounded
first); it is dead-lettered once (the copy's `Nats-Msg-Id` names stream, consumer and
sequence), a body too large to carry replaced by its first bytes, size and hash, and
terminated (acknowledged for good), so no service restarts over it. The delivery limit is
enforced here rather than by the server, so a message whose handler kills the process on every
delivery still reaches the dead-letter stream in the end.

No failure of the bus ends the runner (docs/reliability.md has the table):
- an ack, nak or term that times out or finds the connection down is logged and left: the
  message is redelivered after `ack_wait` (handlers are idempotent);
- a fetch that fails, or a consumer without a leader (503 during an election, the durable
  removed), re-creates and re-binds the durable after a backoff;
- the dead-letter counter and the consumer-lag gauge are kept here, for every service.

Messages are pulled one at a time (see `_fetch_loop`): a Pod event is handled as soon as it is
delivered, not when a batch fills or a long poll ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError
from opentelemetry import trace

from partkeeper import backoff
from partkeeper.lifecycle import cancel_all, honour_cancel
from partkeeper.telemetry import metrics, tracing
from schemas import SchemaError
from schemas.names import CONSUMER, MAX_MSG_BYTES, STREAM_DLQ, ConsumerSpec

T = TypeVar("T")
log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)


class Retry(Exception):
    """The effect could not be made durable now; redeliver after a delay."""

    def __init__(self, reason: str, *, delay: float | None = None) -> None:
        super().__init__(reason)
        self.delay = delay


class Permanent(Exception):
    """The message can never be processed; dead-letter it."""


@dataclass(slots=True)
class Delivery:
    msg: Msg
    attempt: int

    @property
    def subject(self) -> str:
        return self.msg.subject

    async def progress(self) -> None:
        """Tell the server the handler is still working (resets the ack wait)."""
        await self.msg.in_progress()


Decoder = Callable[[bytes], T]
Handler = Callable[[T, Delivery], Awaitable[None]]


class ConsumerRunner(Generic[T]):
    def __init__(
        self,
        js: JetStreamContext,
        *,
        service: str,
        stream: str,
        durable: str,
        filter_subject: str,
        decode: Decoder[T],
        handle: Handler[T],
        dlq_subject: str,
        spec: ConsumerSpec = CONSUMER,
        lag_every: float = 10.0,
        on_dead_letter: Callable[[str], None] | None = None,
    ) -> None:
        self.js = js
        self.service = service
        self.lag_every = lag_every
        self.stream = stream
        self.durable = durable
        self.filter_subject = filter_subject
        self.decode = decode
        self.handle = handle
        self.dlq_subject = dlq_subject
        self.spec = spec
        self.on_dead_letter = on_dead_letter
        self.processed = 0
        self.dead_lettered = 0
        self.unsettled = 0  # acks, naks and terms the server did not confirm

    async def ensure(self) -> None:
        """Create the durable consumer if it does not exist (idempotent across restarts)."""
        config = api.ConsumerConfig(
            durable_name=self.durable,
            name=self.durable,
            filter_subject=self.filter_subject,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            ack_wait=self.spec.ack_wait_seconds,
            max_deliver=-1,
            max_ack_pending=1000,
            num_replicas=self.spec.replicas,
        )
        try:
            await self.js.consumer_info(self.stream, self.durable)
        except NotFoundError:
            await self.js.add_consumer(self.stream, config=config)

    async def run(self, *, fetch_timeout: float = 5.0) -> None:
        """Fetch and process until cancelled, and keep the consumer-lag gauge. Long-polls: no
        busy loop when idle."""
        lag = asyncio.create_task(self._report_lag(), name=f"{self.durable} lag")
        try:
            await self._consume(fetch_timeout)
        finally:
            await cancel_all([lag])

    async def _consume(self, fetch_timeout: float) -> None:
        failures = backoff.Failures(f"consumer {self.durable} on {self.stream}",
                                    backoff.Schedule(cap=5.0))
        while True:
            honour_cancel()
            try:
                await self.ensure()
                sub = await self.js.pull_subscribe_bind(durable=self.durable, stream=self.stream)
            except (TimeoutError, nats.errors.Error) as exc:
                await asyncio.sleep(failures.failed(f"unavailable ({_say(exc)})", "binding again"))
                continue
            try:
                await self._fetch_loop(sub, fetch_timeout)
            except (TimeoutError, nats.errors.Error) as exc:
                await asyncio.sleep(failures.failed(f"failed ({_say(exc)})", "re-creating it"))
            finally:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _fetch_loop(self, sub: JetStreamContext.PullSubscription, timeout: float) -> None:
        while True:
            honour_cancel()
            try:
                # One message per pull: nats.py's fetch of a batch that arrives while its pull
                # waits returns only once the batch is full or the pull expires, which held a
                # lone Pod event for up to the whole long poll (bench.fleet: p99 5 s).
                msgs = await sub.fetch(1, timeout=timeout)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
                await asyncio.sleep(backoff.delay(1))
                continue
            for msg in msgs:
                honour_cancel()  # unprocessed messages are redelivered after ack_wait
                await self.process(msg)

    async def _report_lag(self) -> None:
        gauge = metrics.CONSUMER_LAG.labels(consumer=self.durable)
        depth = metrics.DEAD_LETTER_DEPTH.labels(subject=self.dlq_subject)

        async def report() -> None:
            for what, read, into in (("consumer lag", self.lag, gauge),
                                     ("dead-letter depth", self.dlq_depth, depth)):
                try:
                    into.set(await read())
                except Exception as exc:  # a metric must never stop the consumer
                    log.debug("%s of %s unavailable: %s", what, self.durable, _say(exc))
            honour_cancel()

        await backoff.every(f"the lag of {self.durable}", self.lag_every, report)

    async def dlq_depth(self) -> int:
        """Messages held in PK_DLQ under this consumer's dead-letter subject."""
        info = await self.js.stream_info(STREAM_DLQ, subjects_filter=self.dlq_subject)
        return sum((info.state.subjects or {}).values())

    async def lag(self) -> int:
        """Messages not yet delivered to this consumer (for the consumer-lag metric)."""
        info = await self.js.consumer_info(self.stream, self.durable)
        return int(info.num_pending or 0)

    async def process(self, msg: Msg) -> None:
        attempt = msg.metadata.num_delivered
        if attempt > 1:
            metrics.REDELIVERIES.labels(consumer=self.durable).inc()
        if attempt > self.spec.max_deliver:
            await self._dead_letter(msg, f"gave up after {attempt - 1} deliveries", attempt)
            return
        try:
            item = self.decode(msg.data)
        except SchemaError as exc:
            await self._dead_letter(msg, str(exc), attempt)
            return
        with tracing.span_from(
            msg.headers,
            f"consume {self.stream}",
            attributes={"messaging.destination": msg.subject, "pk.attempt": attempt},
            tracer=_tracer,
        ):
            await self._handle(msg, item, attempt)

    async def _handle(self, msg: Msg, item: T, attempt: int) -> None:
        try:
            await self.handle(item, Delivery(msg, attempt))
        except Permanent as exc:
            await self._dead_letter(msg, str(exc), attempt)
        except Retry as exc:
            await self._retry(msg, str(exc), attempt, exc.delay)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an unexpected failure is retried, never silently acked
            log.exception("handler failed on %s (attempt %d); will retry", msg.subject, attempt)
            await self._retry(msg, f"{type(exc).__name__}: {exc}", attempt, None)
        else:
            if await self._settle("ack", msg, msg.ack_sync()):
                self.processed += 1

    async def _retry(self, msg: Msg, reason: str, attempt: int, delay: float | None) -> None:
        if attempt >= self.spec.max_deliver:
            await self._dead_letter(msg, f"{reason} (after {attempt} deliveries)", attempt)
            return
        wait = delay if delay is not None else backoff.delay(attempt)
        log.info("retrying %s in %.2fs: %s", msg.subject, wait, reason)
        await self._settle("nak", msg, msg.nak(delay=wait))

    async def _dead_letter(self, msg: Msg, error: str, attempt: int) -> None:
        seq = msg.metadata.sequence.stream
        body, carried = dead_letter_body(msg.data)
        headers = {
            # Each reader of a stream dead-letters its own copy: the id names the consumer too.
            "Nats-Msg-Id": f"dlq/{self.stream}/{self.durable}/{seq}",
            "Pk-Original-Subject": msg.subject,
            "Pk-Original-Stream": self.stream,
            "Pk-Original-Sequence": str(seq),
            "Pk-Consumer": self.durable,
            "Pk-Deliveries": str(attempt),
            "Pk-Error": error[:1000].replace("\n", " "),
            **carried,
        }
        try:
            await self.js.publish(self.dlq_subject, body, headers=headers)
        except Exception as exc:
            # The copy is not durable: keep the original rather than lose it.
            log.error("could not dead-letter %s (%s); will redeliver", msg.subject, _say(exc))
            await self._settle("nak", msg, msg.nak(delay=backoff.delay(attempt)))
            return
        log.error("dead-lettered %s seq %d to %s: %s", msg.subject, seq, self.dlq_subject, error)
        metrics.DEAD_LETTERS.labels(service=self.service, stream=self.stream).inc()
        self.dead_lettered += 1
        # A term that is lost only means one more delivery, which finds the copy's id taken.
        await self._settle("term", msg, msg.term())
        if self.on_dead_letter is not None:
            self.on_dead_letter(error)

    async def _settle(self, what: str, msg: Msg, call: Awaitable[object]) -> bool:
        """Send an ack, nak or term; a failure only means the message comes back after
        ack_wait (handlers are idempotent)."""
        try:
            await call
        except (TimeoutError, nats.errors.Error) as exc:
            self.unsettled += 1
            log.warning("%s of %s (stream seq %s) not confirmed (%s); it will be redelivered",
                        what, msg.subject, _sequence(msg), _say(exc))
            return False
        return True


# Room the dead letter's headers take (Pk-Error alone up to 1,000 bytes): a body larger than the
# stream's largest message less this could never be dead-lettered and would come back forever.
DEAD_LETTER_HEADROOM = 4096
DEAD_LETTER_FIRST_BYTES = 1024


def dead_letter_body(data: bytes) -> tuple[bytes, dict[str, str]]:
    """The body a dead letter carries, and headers saying what was left out: the original
    whole when it fits under `names.MAX_MSG_BYTES` with the headers, else its first
    `DEAD_LETTER_FIRST_BYTES` with its size and SHA-256 (`Pk-Original-Size`,
    `Pk-Original-Sha256`, `Pk-Body: first-bytes`)."""
    if len(data) <= MAX_MSG_BYTES - DEAD_LETTER_HEADROOM:
        return data, {}
    return data[:DEAD_LETTER_FIRST_BYTES], {
        "Pk-Body": "first-bytes",
        "Pk-Original-Size": str(len(data)),
        "Pk-Original-Sha256": hashlib.sha256(data).hexdigest(),
    }


def _sequence(msg: Msg) -> str:
    try:
        return str(msg.metadata.sequence.stream)
    except Exception:  # not a JetStream message: nothing to name
        return "?"


def _say(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
