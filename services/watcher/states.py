"""`pods.states`: `pods.get` for many Pods in one round trip, from the watcher's view.

For the GC's sweep, which asks about every Pod directory that holds a slice: one `pods.get` per
directory made a steady sweep of 10,000 live Pods cost 10,000 round trips. Never `fresh` (the
GC's questions are not, docs/gc.md). UIDs the view has never seen cost one LIST for the whole
batch, not one each, and are `unknown` if the LIST does not show them either, as in `pods.get`.
"""

from __future__ import annotations

from schemas import PodsGetReply, PodsStates, PodsStatesReply
from schemas.pods import InvalidPodUID, validate_pod_uid
from services.watcher import answers
from services.watcher.kube import KubeError
from services.watcher.sync import Sync
from services.watcher.view import PodView


async def pods_states(view: PodView, sync: Sync, node: str, query: PodsStates) -> PodsStatesReply:
    found: dict[str, PodsGetReply] = {}
    never_seen: list[str] = []
    for uid in query.uids:
        try:
            validate_pod_uid(uid)
        except InvalidPodUID as exc:
            found[uid] = answers.unknown(uid, f"{exc}; nothing was looked up")
            continue
        record = await view.settled(uid)
        if record is None:
            never_seen.append(uid)
        else:
            found[uid] = slim(answers.known(record, "from the watcher's view"))
    if never_seen:
        found.update(await _look_up(view, sync, node, never_seen))
    return PodsStatesReply(pods=[found[uid] for uid in query.uids])


async def _look_up(
    view: PodView, sync: Sync, node: str, uids: list[str]
) -> dict[str, PodsGetReply]:
    try:
        rv = await sync.relist()
    except KubeError as exc:
        why = f"never seen by the watcher; the API server could not be asked ({exc})"
        return {uid: answers.unknown(uid, why) for uid in uids}
    out: dict[str, PodsGetReply] = {}
    for uid in uids:
        record = view.get(uid)
        out[uid] = (
            slim(answers.known(record, f"found by a LIST at resourceVersion {rv}"))
            if record is not None
            else answers.unknown(uid, f"not among the Pods the API server lists on node {node} "
                                      f"at resourceVersion {rv}, and never seen by the watcher", rv)
        )
    return out


def slim(reply: PodsGetReply) -> PodsGetReply:
    """Without the Pod record: a batch of full records could pass NATS's max payload."""
    return PodsGetReply(uid=reply.uid, state=reply.state, evidence=reply.evidence,
                        resource_version=reply.resource_version)
