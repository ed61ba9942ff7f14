"""The watcher in-process against a real nats-server and the simulated API server, reached by the
real `kubernetes` client: what it announces, what it answers, and what it refuses to conclude."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import pytest
from nats.aio.client import Client

from partkeeper.bus import request
from partkeeper.config import Config
from partkeeper_sim.apiserver import ApiServerThread
from schemas import (
    PendingPodsQuery,
    PendingPodsReply,
    PodGone,
    PodRecord,
    PodSeen,
    PodsGet,
    PodsGetReply,
)
from schemas.names import pods_get_subject, pods_pending_subject
from services.watcher.kube import Kube
from tests_support import until
from tests_support.kubeclient import pod_manifest
from tests_support.watcher import Published, log_lines

MIG = "nvidia.com/mig-1g.10gb"


def create(apiserver: ApiServerThread, node: str, name: str, **limits: int) -> dict[str, Any]:
    body = pod_manifest(name, node=node)
    if limits:
        body["spec"]["containers"][0]["resources"] = {"limits": {MIG: str(limits["mig"])}}
    return apiserver.create_pod(body)


def uid_of(pod: dict[str, Any]) -> str:
    return pod["metadata"]["uid"]


async def get(nc: Client, node: str, uid: str, fresh: bool = False) -> PodsGetReply:
    return await request(nc, pods_get_subject(node), PodsGet(uid=uid, fresh=fresh), PodsGetReply,
                         timeout=10)


async def test_a_pods_life_is_announced_once_per_fact(
    apiserver: ApiServerThread, start_watcher: Any, published: Published, nc: Client, node: str
) -> None:
    await start_watcher()
    uid = uid_of(create(apiserver, node, "a", mig=1))
    await published.wait_for(uid, "PodSeen")
    apiserver.patch_pod("default", "a", {"status": {"phase": "Running"}}, status=True)
    await published.wait_for(uid, "PodSeen", 2)
    apiserver.delete_pod("default", "a", grace_period_seconds=30)
    await published.wait_for(uid, "PodSeen", 3)
    terminating = published.of(uid, "PodSeen")[-1]
    assert isinstance(terminating, PodSeen) and terminating.deleting
    # Invariant 1: a terminating Pod is live.
    assert (await get(nc, node, uid, fresh=True)).state == "live"
    apiserver.patch_pod("default", "a", {"status": {"phase": "Succeeded"}}, status=True)
    await published.wait_for(uid, "PodFinished")
    apiserver.delete_pod("default", "a", grace_period_seconds=0)
    await published.wait_for(uid, "PodGone")
    kinds = [type(e).__name__ for e in published.of(uid)]
    assert kinds == ["PodSeen", "PodSeen", "PodSeen", "PodFinished", "PodGone"]
    ids = [i for e, i in published.events if e.uid == uid]
    assert len(set(ids)) == len(ids)
    reply = await get(nc, node, uid)
    assert (reply.state, reply.pod and reply.pod.gone_evidence) == ("gone", "deleted")


async def test_pods_get_answers_with_evidence_and_never_guesses(
    apiserver: ApiServerThread, start_watcher: Any, published: Published, nc: Client, node: str
) -> None:
    uid = uid_of(create(apiserver, node, "a"))
    await start_watcher()
    cached = await get(nc, node, uid)
    assert cached.state == "live" and cached.resource_version and cached.pod is not None
    fresh = await get(nc, node, uid, fresh=True)
    assert fresh.state == "live" and "confirmed by a GET" in fresh.evidence
    # A UID never seen: the watcher LISTs afresh, and absence from the LIST is not death.
    stranger = await get(nc, node, str(uuid.uuid4()))
    assert stranger.state == "unknown" and "not among the Pods" in stranger.evidence
    odd = await get(nc, node, "../../etc/passwd")
    assert odd.state == "unknown" and "not a lowercase RFC 4122 UUID" in odd.evidence
    # A Pod the watch has not delivered yet is found by that LIST, not reported unknown.
    apiserver.stall_watches(True)
    late = uid_of(create(apiserver, node, "late"))
    assert (await get(nc, node, late)).state == "live"
    await published.wait_for(late, "PodSeen")
    apiserver.stall_watches(False)


async def test_a_fresh_get_confirms_death_before_the_watch_delivers_it(
    apiserver: ApiServerThread, start_watcher: Any, published: Published, nc: Client, node: str
) -> None:
    first = uid_of(create(apiserver, node, "a"))
    second = uid_of(create(apiserver, node, "b"))
    await start_watcher()
    apiserver.stall_watches(True)
    apiserver.delete_pod("default", "a", grace_period_seconds=0)
    apiserver.delete_pod("default", "b", grace_period_seconds=0)
    successor = uid_of(create(apiserver, node, "b"))
    assert (await get(nc, node, first)).state == "live"  # not fresh: the view as it is
    by_404 = await get(nc, node, first, fresh=True)
    by_uid = await get(nc, node, second, fresh=True)
    assert (by_404.state, by_404.pod and by_404.pod.gone_evidence) == ("gone", "get-404")
    assert (by_uid.state, by_uid.pod and by_uid.pod.gone_evidence) == ("gone", "get-other-uid")
    await published.wait_for(first, "PodGone")
    await published.wait_for(second, "PodGone")
    # The watch then delivers the same deaths: the tombstones make them no-ops.
    apiserver.stall_watches(False)
    await published.wait_for(successor, "PodSeen")
    assert len(published.of(first, "PodGone")) == len(published.of(second, "PodGone")) == 1


async def test_nothing_is_declared_gone_while_the_api_server_is_unreachable(
    apiserver: ApiServerThread, start_watcher: Any, published: Published, nc: Client, node: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    uid = uid_of(create(apiserver, node, "a"))
    await start_watcher()
    apiserver.set_unavailable(True)
    apiserver.delete_pod("default", "a", grace_period_seconds=0)
    await until(lambda: len(log_lines(caplog, "API server unreachable")) >= 3,
                "three logged retries", 15)
    assert "no Pod is declared gone" in log_lines(caplog, "API server unreachable")[0]
    reply = await get(nc, node, uid, fresh=True)
    assert reply.state == "live" and "not confirmed" in reply.evidence
    stranger = await get(nc, node, str(uuid.uuid4()))
    assert stranger.state == "unknown" and "could not be asked" in stranger.evidence
    assert not published.of(uid, "PodGone")
    apiserver.set_unavailable(False)
    await published.wait_for(uid, "PodGone")
    (gone,) = published.of(uid, "PodGone")
    assert isinstance(gone, PodGone) and gone.evidence == "deleted"


async def test_a_watcher_starting_without_the_api_server_answers_from_its_view_only(
    apiserver: ApiServerThread, start_watcher: Any, published: Published, nc: Client, node: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    uid = uid_of(create(apiserver, node, "a"))
    await (await start_watcher()).stop()
    apiserver.set_unavailable(True)
    apiserver.delete_pod("default", "a", grace_period_seconds=0)
    restarted = await start_watcher(wait_ready=False)
    await until(lambda: len(log_lines(caplog, "API server unreachable")) >= 2,
                "logged retries of the first LIST", 15)
    assert not restarted.ready.is_set()
    reply = await get(nc, node, uid, fresh=True)
    assert reply.state == "live" and "not confirmed" in reply.evidence
    assert [type(e).__name__ for e in published.of(uid)] == ["PodSeen"]
    apiserver.set_unavailable(False)
    await published.wait_for(uid, "PodGone")
    await until(restarted.ready.is_set, "ready once the first LIST is applied", 10)


async def test_the_410_path_loses_nothing(
    apiserver: ApiServerThread, start_watcher: Any, published: Published, node: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    deleted = uid_of(create(apiserver, node, "deleted"))
    changed = uid_of(create(apiserver, node, "changed"))
    await start_watcher()
    await published.wait_for(changed, "PodSeen")
    apiserver.set_unavailable(True)
    await until(lambda: log_lines(caplog, "API server unreachable"), "a logged retry", 15)
    apiserver.delete_pod("default", "deleted", grace_period_seconds=0)
    apiserver.patch_pod("default", "changed", {"status": {"phase": "Running"}}, status=True)
    added = uid_of(create(apiserver, node, "added"))
    apiserver.compact()
    apiserver.set_unavailable(False)
    await published.wait_for(deleted, "PodGone")
    await published.wait_for(changed, "PodSeen", 2)
    await published.wait_for(added, "PodSeen")
    assert log_lines(caplog, "listing again")
    (gone,) = published.of(deleted, "PodGone")
    assert isinstance(gone, PodGone) and gone.evidence == "relist"


async def test_bookmarks_keep_the_resume_point_current(
    apiserver: ApiServerThread, start_watcher: Any, nc: Client, node: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Changes elsewhere never reach this node's watch; bookmarks still move its resume point,
    so a compaction of that history does not force a LIST."""
    await start_watcher()
    create(apiserver, "another-node", "elsewhere")
    latest = apiserver.resource_version

    async def view_version() -> int:
        reply = await request(nc, pods_pending_subject(node),
                              PendingPodsQuery(resource=MIG, quantity=1), PendingPodsReply)
        return int(reply.resource_version)

    async def bookmarked() -> bool:
        return await view_version() >= latest

    await until(bookmarked, "a bookmark reached the view", 10)
    apiserver.set_unavailable(True)
    await until(lambda: log_lines(caplog, "API server unreachable"), "a logged retry", 15)
    apiserver.compact()
    apiserver.set_unavailable(False)
    await until(lambda: log_lines(caplog, "watching again"), "the watch resumed", 15)
    assert not log_lines(caplog, "listing again")


async def test_duplicate_and_reordered_watch_events_change_nothing(
    apiserver: ApiServerThread, start_watcher: Any, published: Published, nc: Client, node: str
) -> None:
    await start_watcher()
    pending = create(apiserver, node, "a")
    uid = uid_of(pending)
    running = apiserver.patch_pod("default", "a", {"status": {"phase": "Running"}}, status=True)
    await published.wait_for(uid, "PodSeen", 2)
    final = apiserver.delete_pod("default", "a", grace_period_seconds=0)
    await published.wait_for(uid, "PodGone")
    for kind, obj in [("MODIFIED", running), ("MODIFIED", pending), ("ADDED", pending),
                      ("DELETED", final), ("MODIFIED", running)]:
        assert apiserver.send_raw_watch_line("pods", _line(kind, obj)) == 1
    sentinel = uid_of(create(apiserver, node, "sentinel"))
    await published.wait_for(sentinel, "PodSeen")  # the watch has processed every line above
    assert [type(e).__name__ for e in published.of(uid)] == ["PodSeen", "PodSeen", "PodGone"]
    assert (await get(nc, node, uid)).state == "gone"


async def test_malformed_objects_and_odd_uids_are_skipped_and_change_nothing(
    apiserver: ApiServerThread, start_watcher: Any, published: Published, nc: Client, node: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    known = uid_of(create(apiserver, node, "known"))
    await start_watcher()
    good = create(apiserver, node, "template")
    odd = [
        _variant(good, "path-uid", uid="../../etc/passwd"),
        _variant(good, "upper-uid", uid=str(uuid.uuid4()).upper()),
        _variant(good, "odd-phase", uid=str(uuid.uuid4()), phase="Exploded"),
        # Under the known Pod's own name: its namesake is damaged, not gone.
        _variant(good, "known", uid="not-a-uid"),
    ]
    for obj in odd:
        apiserver.inject("pods", obj, "MODIFIED" if obj["metadata"]["name"] == "known" else "ADDED")
    # The last line breaks the client's parser: the watch resumes from the last version seen.
    for line in ("this is not JSON", '{"type": "ADDED", "object": "a string"}', "[1, 2]"):
        apiserver.send_raw_watch_line("pods", line)
    sentinel = uid_of(create(apiserver, node, "sentinel"))
    await published.wait_for(sentinel, "PodSeen")
    skipped = log_lines(caplog, "skipped")
    for fragment in ("../../etc/passwd", "RFC 4122", "Exploded", "not-a-uid", "not JSON",
                     "a str, not a JSON object", "skipped the rest of a watch"):
        assert any(fragment in line for line in skipped), (fragment, skipped)
    # A LIST that holds the damaged namesake does not show the known Pod absent.
    apiserver.set_unavailable(True)
    await until(lambda: log_lines(caplog, "API server unreachable"), "a logged retry", 15)
    create(apiserver, "another-node", "elsewhere")  # history moves on past the watcher...
    apiserver.compact()  # ...and is forgotten: the watch cannot resume, the watcher LISTs
    listed = len(log_lines(caplog, "listed the node's Pods"))
    apiserver.set_unavailable(False)
    await until(lambda: len(log_lines(caplog, "listed the node's Pods")) > listed, "a relist", 15)
    expected = {known, uid_of(good), sentinel}
    assert {e.uid for e, _ in published.events} == expected
    assert all(type(e).__name__ == "PodSeen" for e, _ in published.events)
    assert (await get(nc, node, known)).state == "live"


async def test_pending_pods_oldest_first(
    apiserver: ApiServerThread, start_watcher: Any, nc: Client, node: str
) -> None:
    await start_watcher()
    first = uid_of(create(apiserver, node, "first", mig=1))
    create(apiserver, node, "two", mig=2)
    create(apiserver, node, "plain")
    second = uid_of(create(apiserver, node, "second", mig=1))
    create(apiserver, node, "running", mig=1)
    apiserver.patch_pod("default", "running", {"status": {"phase": "Running"}}, status=True)
    reply = await request(nc, pods_pending_subject(node),
                          PendingPodsQuery(resource=MIG, quantity=1, fresh=True),
                          PendingPodsReply, timeout=10)
    # Oldest first; created in the same second, "first" sorts before "second" by name.
    assert [p.uid for p in reply.pods] == [first, second]
    assert reply.resource_version


async def test_events_reach_the_api_server(apiserver: ApiServerThread,
                                           watcher_config: Config, node: str) -> None:
    pod = create(apiserver, node, "a")
    kube = await Kube.connect(watcher_config)
    try:
        record = _record(pod, node)
        await kube.create_event(record, "PartitionBlocked", "no room on card 0", "Warning")
    finally:
        kube.close()
    (event,) = apiserver.events("default")
    assert event["reason"] == "PartitionBlocked" and event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == uid_of(pod)


def _line(kind: str, obj: dict[str, Any]) -> str:
    return json.dumps({"type": kind, "object": obj})


def _variant(pod: dict[str, Any], name: str, *, uid: str, phase: str = "Pending") -> dict[str, Any]:
    obj = copy.deepcopy(pod)
    obj["metadata"].update(name=name, uid=uid)
    obj["status"]["phase"] = phase
    return obj


def _record(pod: dict[str, Any], node: str) -> PodRecord:
    return PodRecord(node=node, uid=uid_of(pod), namespace="default",
                     name=pod["metadata"]["name"], phase="Pending", state="live",
                     resource_version=pod["metadata"]["resourceVersion"], updated_at=0)
