"""What the access-control tests share (tests/reliability/test_access_control.py against the
shipped nats.conf, test_jwt_roles.py against JWT accounts minted from the same table): a client
session that records the server's permission errors, and per service what it must be allowed and
what it must be refused."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import nats.errors
from nats.aio.client import Client

from partkeeper.bus.permissions import PROVISION, TOPOLOGY, inbox_prefix
from partkeeper_sim.stack.launch import SERVICES
from partkeeper_sim.stack.natsserver import NatsServer

CONFIG = Path(__file__).resolve().parents[2] / "compose" / "nats" / "nats.conf"
ADMIN = ("pk-admin", "pk-admin-dev")
NODE, OTHER = "sim-node-0", "sim-node-1"
REFUSAL_SECONDS = 5.0
ALLOWED_SECONDS = 0.5


def user(service: str) -> tuple[str, str]:
    return f"pk-{service}", f"pk-{service}-dev"


class Session:
    """A connection as one user, remembering every error the server sent it."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: Client | None = None

    async def open(self, url: str, name: str, password: str) -> Session:
        return await self.open_with(url, user=name, password=password)

    async def open_with(self, url: str, **login: str) -> Session:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc).lower())

        self.nc = await nats.connect(url, error_cb=on_error, allow_reconnect=False,
                                     connect_timeout=2, **login)
        return self

    @property
    def client(self) -> Client:
        """The connection, failing the test where the session never connected."""
        if self.nc is None:
            raise AssertionError("the session is not connected")
        return self.nc

    async def refused(self, what: str, subject: str, within: float = REFUSAL_SECONDS) -> bool:
        """The server said `what` ("publish"/"subscription") to `subject` is not allowed.

        The server answers a refused operation before the flush's PONG, so an allowed one needs
        only a short look after the flush."""
        await self.client.flush()
        wanted = f"permissions violation for {what} to \"{subject.lower()}\""
        end = time.monotonic() + within
        while not any(wanted in e for e in self.errors):
            if time.monotonic() > end:
                return False
            await asyncio.sleep(0.05)  # the error arrives asynchronously; bounded wait
        return True

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


async def as_user(server: NatsServer, service: str) -> Session:
    return await Session().open(server.url, *user(service))


# -- least privilege, per service user (issue: one provisioning identity, private inboxes,
#    node-scoped reads) ------------------------------------------------------------------------

UID = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
OWN_EVENTS = {  # what only that service publishes (besides its own dead letters)
    "watcher": [f"pk.pods.{NODE}.{UID}", f"$KV.pk-pods.{NODE}.{UID}"],
    # the node-scope audit subject is the allocator's (its refusals), the GC has its own; the
    # allocator and the reclaimer share the card subjects (claim transitions)
    "allocator": [f"pk.parts.{NODE}.0", f"pk.parts.{NODE}.node", f"$KV.pk-claims.{NODE}.0",
                  f"$KV.pk-capacity.{NODE}"],
    "reclaimer": [f"pk.parts.{NODE}.0", f"$KV.pk-claims.{NODE}.0"],
    "gc": [f"pk.parts.{NODE}.gc"],
}
OWN_READS = {
    "watcher": [f"$JS.API.DIRECT.GET.KV_pk-pods.$KV.pk-pods.{NODE}.{UID}"],
    "allocator": [f"$JS.API.DIRECT.GET.KV_pk-claims.$KV.pk-claims.{NODE}.0",
                  f"$JS.API.DIRECT.GET.KV_pk-pods.$KV.pk-pods.{NODE}.{UID}",
                  # its watches (bus/ordered.py): any name, this node's subjects in the subject
                  f"$JS.API.CONSUMER.CREATE.KV_pk-claims.w1.$KV.pk-claims.{NODE}.*",
                  f"$JS.API.CONSUMER.CREATE.KV_pk-pods.w1.$KV.pk-pods.{NODE}.*",
                  f"$JS.API.CONSUMER.CREATE.PK_PARTITIONS.w1.pk.parts.{NODE}.*"],
    "reclaimer": [f"$JS.API.DIRECT.GET.KV_pk-claims.$KV.pk-claims.{NODE}.0"],
    "gc": [],
}

def others_events(service: str) -> list[str]:
    mine = set(OWN_EVENTS[service])
    theirs = {s for other, subjects in OWN_EVENTS.items() if other != service for s in subjects}
    dead_letters = {f"pk.dlq.{NODE}.{o}" for o in ("watcher-events", "reclaimer", "gc")
                    if not o.startswith(service)}
    return sorted((theirs - mine) | dead_letters)


def topology_changes() -> list[str]:
    return [f"$JS.API.STREAM.{verb}.{name}" for name in TOPOLOGY
            for verb in ("CREATE", "UPDATE", "DELETE", "PURGE")]


def other_reads() -> list[str]:
    return [f"$JS.API.DIRECT.GET.KV_pk-claims.$KV.pk-claims.{OTHER}.0",
            f"$JS.API.DIRECT.GET.KV_pk-pods.$KV.pk-pods.{OTHER}.{UID}",
            f"$JS.API.DIRECT.GET.KV_pk-capacity.$KV.pk-capacity.{OTHER}",
            # the key in the body could name any node: not granted since the buckets are direct
            "$JS.API.STREAM.MSG.GET.KV_pk-claims", "$JS.API.STREAM.MSG.GET.KV_pk-pods",
            "$JS.API.DIRECT.GET.KV_pk-claims", "$JS.API.DIRECT.GET.KV_pk-pods"]


def forbidden_watches(service: str) -> list[str]:
    """Watches no service may create: an unnamed consumer (its filter only in the body, so it
    could read every node's records), a named one on another node's subjects, one named as the
    watcher's durable (the server would update that consumer), and deleting a consumer (the
    watches leave theirs to the server's inactive threshold)."""
    unnamed = ["$JS.API.CONSUMER.CREATE.KV_pk-claims", "$JS.API.CONSUMER.CREATE.KV_pk-pods",
               "$JS.API.CONSUMER.CREATE.KV_pk-capacity", "$JS.API.CONSUMER.CREATE.PK_PARTITIONS"]
    others = [f"$JS.API.CONSUMER.CREATE.KV_pk-claims.w1.$KV.pk-claims.{OTHER}.*",
              f"$JS.API.CONSUMER.CREATE.KV_pk-pods.w1.$KV.pk-pods.{OTHER}.*",
              "$JS.API.CONSUMER.CREATE.KV_pk-claims.w1.$KV.pk-claims.*.*",
              f"$JS.API.CONSUMER.CREATE.PK_PARTITIONS.w1.pk.parts.{OTHER}.*",
              "$JS.API.CONSUMER.CREATE.PK_PARTITIONS.w1.pk.parts.>"]
    deletes = [f"$JS.API.CONSUMER.DELETE.PK_PARTITIONS.watcher-events-pk_partitions-{NODE}",
               "$JS.API.CONSUMER.DELETE.KV_pk-claims.w1", "$JS.API.CONSUMER.DELETE.KV_pk-pods.w1"]
    durable = f"watcher-events-pk_partitions-{NODE}"
    theirs = [] if service == "watcher" else [
        f"$JS.API.CONSUMER.CREATE.PK_PARTITIONS.{durable}.pk.parts.{NODE}.*"]
    return unnamed + others + theirs + deletes


def foreign_inboxes(service: str) -> list[str]:
    others = [s for s in (*SERVICES, PROVISION) if s != service]
    return ["_INBOX.>", f"_INBOX.{NODE}.>", f"_INBOX.{OTHER}.{service}.>",
            *(inbox_prefix(o, None if o == PROVISION else NODE) + ".>" for o in others)]


async def all_refused(session: Session, publishes: list[str], subscribes: list[str]) -> None:
    for subject in publishes:
        await session.client.publish(subject, b"{}")
    for subject in subscribes:
        await session.client.subscribe(subject)
    for subject in publishes:
        assert await session.refused("publish", subject), (subject, session.errors[-3:])
    for subject in subscribes:
        assert await session.refused("subscription", subject), (subject, session.errors[-3:])


async def none_refused(session: Session, publishes: list[str], subscribes: list[str]) -> None:
    for subject in publishes:
        await session.client.publish(subject, b"{}")
    for subject in subscribes:
        await session.client.subscribe(subject)
    await session.client.flush()
    await asyncio.sleep(ALLOWED_SECONDS)  # a refusal would have arrived before the PONG
    assert not [e for e in session.errors if "permissions violation" in e], session.errors
