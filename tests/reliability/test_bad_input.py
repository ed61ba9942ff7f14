"""Garbage on every subject the services consume (invariant 10), with the whole stack running.

Stream subjects (`pk.pods.<node>.*`, read by the reclaimer and the GC; `pk.parts.<node>.*`, read
by the watcher's Event recorder): every undecodable message is copied to PK_DLQ by each consumer,
with headers naming the original subject and sequence. Request subjects (pods.get, pods.pending,
claims.query, reclaim.now): every garbage request gets an error reply (micro headers and a JSON
body). Afterwards every service is still up and a Pod is admitted and reclaimed as usual; a
planted file outside PK_PODS_DIR, named by a path-trick "UID", is untouched.
"""

from __future__ import annotations

import asyncio
import json
import time

import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.micro.request import ERROR_CODE_HEADER

from partkeeper_sim.stack.launch import MICRO_SERVICES, SERVICES, service_ready
from schemas import (
    ClaimsQuery,
    PendingPodsQuery,
    PodGone,
    PodsGet,
    PodsStates,
    ReclaimNow,
    SchemaError,
    decode_request,
)
from schemas.names import (
    STREAM_PARTITIONS,
    STREAM_PODS,
    claims_query_subject,
    dlq_subject,
    encode_token,
    pods_get_subject,
    pods_pending_subject,
    pods_states_subject,
    reclaim_now_subject,
)
from tests_support.reliability import Scene, scene

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]

DLQ_SECONDS = 30.0
# Per stream, the services reading it and the name each dead-letters under (pk.dlq.<node>.<name>).
READERS = {STREAM_PODS: {"reclaimer": "reclaimer", "gc": "gc"},
           STREAM_PARTITIONS: {"watcher": "watcher-events"}}
COPIES_SECONDS = 10.0


def garbage() -> list[bytes]:
    """Payloads no decoder may accept: not JSON, wrong shapes, versions, tags and fields."""
    return [
        b"", b"\x00\xff\xfe", b"not json", b"[1, 2, 3]", b"null", b'"PodGone"', b"{",
        b'{"v": 1}', b'{"type": "PodGone"}', b'{"v": 999, "type": "PodGone"}',
        b'{"v": "1", "type": "PodGone"}', b'{"v": true, "type": "PodGone"}',
        b'{"v": 1, "type": "NoSuchEvent", "uid": "x"}',
        b'{"v": 1, "type": "PodGone", "uid": 7}',
        b'{"v": 1, "type": "ClaimChanged", "card": "zero"}',
        json.dumps({"v": 1, "type": "PodSeen", "phase": "Exploded", "node": "n", "uid": "u",
                    "namespace": "d", "name": "p", "resource_version": "1",
                    "observed_at": 0}).encode(),
        b"\xef\xbb\xbf" + b'{"v": 1}', b"{" * 5000,
    ]


def path_trick(node: str) -> bytes:
    """A well-formed PodGone whose UID tries to name a path outside PK_PODS_DIR."""
    event = PodGone(node=node, uid="../outside", namespace="default", name="x",
                    resource_version="1", observed_at=time.time(), evidence="deleted")
    return msgspec.json.encode(event)


async def publish_all(
    js: JetStreamContext, subject: str, bodies: list[bytes], tag: str
) -> set[int]:
    seqs = set()
    for i, body in enumerate(bodies):
        ack = await js.publish(subject, body, headers={"Nats-Msg-Id": f"garbage/{tag}/{i}"})
        seqs.add(ack.seq)
    return seqs


async def dead_letters(js: JetStreamContext, subject: str, stream: str) -> set[int]:
    """Original sequences of `stream` dead-lettered on `subject` (wildcards allowed)."""
    found: set[int] = set()
    sub = await js.subscribe(subject, ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except TimeoutError:
                return found
            headers = msg.headers or {}
            if headers.get("Pk-Original-Stream") == stream:
                found.add(int(headers["Pk-Original-Sequence"]))
    finally:
        await sub.unsubscribe()


async def all_dead_lettered(sc: Scene, stream: str, seqs: set[int], *, each: bool,
                            deadline: float = DLQ_SECONDS) -> None:
    """Every one of `seqs` is in PK_DLQ: copied by each of the stream's readers (`each`), or by
    at least one of them."""
    js, node = sc.rig.stack.nc.jetstream(), sc.rig.stack.node
    readers = READERS[stream]
    subjects = ([dlq_subject(node, name) for name in readers.values()] if each
                else [f"pk.dlq.{encode_token(node)}.*"])
    end = time.monotonic() + deadline
    for subject in subjects:
        while (missing := seqs - await dead_letters(js, subject, stream)):
            assert time.monotonic() < end, (
                f"{stream} seqs {sorted(missing)} not in PK_DLQ on {subject}\n"
                f"{sc.logs(list(readers))}")
            await asyncio.sleep(0.2)  # asked again until the deadline


def valid(body: bytes, kind: type) -> bool:
    try:
        decode_request(body, kind)
    except SchemaError:
        return False
    return True


def error_body(data: bytes, code: int) -> bool:
    """The reply body is the documented error document {"error": str, "code": code}."""
    try:
        body = json.loads(data)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("code") == code and \
        isinstance(body.get("error"), str) and bool(body["error"])


async def not_refused(nc: Client, node: str) -> list[str]:
    """Each request subject with each garbage body: the replies that are not a 400 error."""
    subjects = {pods_get_subject(node): PodsGet, pods_states_subject(node): PodsStates,
                pods_pending_subject(node): PendingPodsQuery,
                claims_query_subject(node): ClaimsQuery, reclaim_now_subject(node): ReclaimNow}
    wrong = []
    for subject, kind in subjects.items():
        for body in garbage():
            if valid(body, kind):
                continue  # e.g. {"v": 1} is a ClaimsQuery with every field defaulted
            msg = await nc.request(subject, body, timeout=5.0)
            code = (msg.headers or {}).get(ERROR_CODE_HEADER, "")
            if code != "400" or not error_body(msg.data, 400):
                wrong.append(f"{subject} {body[:60]!r}: code {code!r}, reply {msg.data[:200]!r}")
    return wrong


async def test_garbage_on_every_consumed_subject() -> None:
    async with scene() as sc:
        nc, node = sc.rig.stack.nc, sc.rig.stack.node
        js = nc.jetstream()
        outside = sc.rig.layout.root / "outside"
        outside.mkdir()
        (outside / "keep").write_text("not partkeeper's")
        token = encode_token(node)
        pods = await publish_all(js, f"pk.pods.{token}.garbage", garbage(), "pods")
        pods |= await publish_all(js, f"pk.pods.{token}.trick", [path_trick(node)], "trick")
        parts = await publish_all(js, f"pk.parts.{token}.0", garbage(), "parts")
        wrong = await not_refused(nc, node)
        assert not wrong, "\n".join(wrong)
        # Even the well-formed path-trick event: its UID is not a Pod UID, both readers refuse it.
        await all_dead_lettered(sc, STREAM_PODS, pods, each=False)
        await all_dead_lettered(sc, STREAM_PARTITIONS, parts, each=True)
        for name in SERVICES:
            assert sc.rig.alive(name), sc.logs([name])
            if name in MICRO_SERVICES:
                await asyncio.wait_for(service_ready(nc, name), 10.0)
        pod = await sc.admit("1g.10gb", "after")
        await sc.work.delete(pod)
        await sc.check_converged()
        assert (outside / "keep").read_text() == "not partkeeper's"



async def test_each_reader_dead_letters_its_own_copy() -> None:
    async with scene() as sc:
        js, token = sc.rig.stack.nc.jetstream(), encode_token(sc.rig.stack.node)
        seqs = await publish_all(js, f"pk.pods.{token}.garbage", garbage()[:4], "copies")
        await all_dead_lettered(sc, STREAM_PODS, seqs, each=True, deadline=COPIES_SECONDS)

