"""What "ready" means for each part of the stack, each as one awaitable.

They take no deadline of their own: the caller races them against a deadline and against a child
dying (`Supervisor.guard`). Where the only way to know is to ask (a NATS ping, a consumer lookup,
the kubelet's pod-resources API), they ask again after a short, growing pause: every pause ends in
an answer from the component itself, never in an assumption.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import grpc
import nats
import nats.errors
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from partkeeper import backoff
from partkeeper.kubelet import open_unix_channel, podresources_pb2, podresources_pb2_grpc


async def _pause(attempt: int) -> None:
    await asyncio.sleep(backoff.delay(attempt, base=0.05, cap=1.0))


async def connect_nats(url: str, user: str = "", password: str = "", *,
                       inbox: str | None = None) -> Client:
    """A connection to the embedded server(s) (`url` comma separated), once one accepts it;
    `inbox` is the inbox prefix (the operators' one of the node: the services answer only
    there)."""

    async def quiet(exc: Exception) -> None:
        """Connection errors while the server starts are expected; the guard reports a failure."""

    attempt = 0
    while True:
        attempt += 1
        try:
            return await nats.connect(
                servers=url.split(","), connect_timeout=1.0, allow_reconnect=True,
                max_reconnect_attempts=-1, reconnect_time_wait=0.5, error_cb=quiet,
                name="partkeeper-up", user=user or None, password=password or None,
                **({"inbox_prefix": inbox} if inbox else {}),
            )
        except (OSError, nats.errors.Error, TimeoutError):
            await _pause(attempt)


async def read_notification(pipe: BinaryIO) -> dict[str, Any] | None:
    """The readiness line the simulated cluster writes to its notify pipe (then closes it);
    None when the pipe closed without one (the cluster stopped)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe
    )
    try:
        line = await reader.readline()
    finally:
        transport.close()
    if not line:
        return None
    description: dict[str, Any] = json.loads(line)
    return description


async def answers_ping(nc: Client, service: str) -> None:
    """The NATS micro service answers `$SRV.PING.<service>`."""
    attempt = 0
    while True:
        attempt += 1
        try:
            await nc.request(f"$SRV.PING.{service}", b"", timeout=1.0)
            return
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            await _pause(attempt)


async def consumer_exists(nc: Client, stream: str, durable: str) -> None:
    """The durable consumer exists (how the GC, which has no micro service, shows it is up)."""
    js = nc.jetstream()
    attempt = 0
    while True:
        attempt += 1
        try:
            await js.consumer_info(stream, durable)
            return
        except (NotFoundError, nats.errors.TimeoutError):
            await _pause(attempt)


async def allocatable(socket: Path) -> dict[str, list[str]]:
    """The kubelet's Healthy devices per resource (pod-resources `GetAllocatableResources`)."""
    async with open_unix_channel(socket) as channel:
        return await allocatable_on(channel)


async def allocatable_on(channel: grpc.aio.Channel) -> dict[str, list[str]]:
    """`allocatable` over a channel the caller holds."""
    stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
    reply = await stub.GetAllocatableResources(
        podresources_pb2.AllocatableResourcesRequest(), timeout=2.0
    )
    found: dict[str, list[str]] = {}
    for devices in reply.devices:
        found.setdefault(devices.resource_name, []).extend(devices.device_ids)
    return found


async def kubelet_offers(socket: Path, resources: Iterable[str]) -> None:
    """The kubelet has every resource registered, each with at least one Healthy device."""
    wanted = set(resources)
    attempt = 0
    while True:
        attempt += 1
        with contextlib.suppress(Exception):  # not serving yet, or mid-restart: ask again
            healthy = await allocatable(socket)
            if all(healthy.get(r) for r in wanted):
                return
        await _pause(attempt)
