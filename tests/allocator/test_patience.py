"""An Allocate's store call waits while the store is unreachable, bounded, and honours cancel."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import cast

import nats.errors
import nats.js.errors
import pytest

from partkeeper.bus import NoAnswer, RemoteError
from partkeeper.claims import StoreReadError
from services.allocator.core import state
from services.allocator.core.state import Context, SnapshotError


def ctx(budget: float) -> Context:
    # `waiting` reads only `ctx.options.room_wait_seconds`: a stand-in rather than a whole
    # allocator (a connection, a driver, a kubelet view) for a pure retry rule.
    return cast(Context, SimpleNamespace(options=SimpleNamespace(room_wait_seconds=budget)))


def unavailable() -> nats.js.errors.APIError:
    return nats.js.errors.ServiceUnavailableError(
        code=503, description="JetStream system temporarily unavailable")


def wrapped_timeout() -> SnapshotError:
    try:
        try:
            raise nats.errors.TimeoutError
        except nats.errors.TimeoutError as exc:
            raise StoreReadError("reading claims of card 0 failed: nats: timeout") from exc
    except StoreReadError as exc:
        try:
            raise SnapshotError(f"reading the claims failed: {exc}") from exc
        except SnapshotError as outer:
            return outer


@pytest.mark.parametrize("error", [wrapped_timeout, unavailable, nats.errors.ConnectionClosedError])
async def test_an_unreachable_store_is_waited_for(error) -> None:
    failures = [error(), error()]

    async def call() -> str:
        if failures:
            raise failures.pop()
        return "read"

    assert await state.waiting(ctx(30), "reading the claims", call) == "read"
    assert failures == []


@pytest.mark.parametrize("error", [
    lambda: StoreReadError("claims document n.0 names node m card 0"),
    lambda: nats.js.errors.BadRequestError(code=400, description="wrong last sequence"),
])
async def test_other_failures_are_raised_at_once(error) -> None:
    calls = 0

    async def call() -> None:
        nonlocal calls
        calls += 1
        raise error()

    with pytest.raises((StoreReadError, nats.js.errors.BadRequestError)):
        await state.waiting(ctx(30), "reading the claims", call)
    assert calls == 1


async def test_the_wait_is_bounded_then_fails_closed() -> None:
    calls = 0

    async def call() -> None:
        nonlocal calls
        calls += 1
        raise wrapped_timeout()

    with pytest.raises(SnapshotError):
        await state.waiting(ctx(0.3), "reading the claims", call)
    assert calls > 1


async def test_cancellation_ends_the_wait() -> None:
    started = asyncio.Event()

    async def call() -> None:
        started.set()
        raise unavailable()

    task = asyncio.create_task(state.waiting(ctx(600), "reading the claims", call))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_watcher_without_a_usable_answer_is_asked_again_until_the_deadline() -> None:
    answers: list[Exception] = [RemoteError("500", "could not persist: no response from stream"),
                                NoAnswer("no answer on pods.pending within 2s")]

    async def call() -> str:
        if answers:
            raise answers.pop()
        return "pods"

    until = asyncio.get_running_loop().time() + 30
    assert await state.answered(until, "pods.pending", call) == "pods"


async def test_a_refused_request_is_not_asked_again() -> None:
    calls = 0

    async def call() -> None:
        nonlocal calls
        calls += 1
        raise RemoteError("400", "pods.pending request has schema version 9")

    until = asyncio.get_running_loop().time() + 30
    with pytest.raises(RemoteError):
        await state.answered(until, "pods.pending", call)
    assert calls == 1
