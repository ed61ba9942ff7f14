"""The `pk-watcher` micro service: `pods.get` and `pods.pending` (docs/protocol.md).

Every answer is a value that says what it rests on. When the API server cannot be asked, the
answer says so and claims nothing new: a known Pod keeps its last known state, an unknown one
stays `unknown`; nobody is ever reported gone for want of an answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from partkeeper.bus.rpc import Endpoint
from schemas import (
    PendingPodsQuery,
    PendingPodsReply,
    PodRecord,
    PodsGet,
    PodsGetReply,
    PodsStates,
    PodsStatesReply,
)
from schemas.names import pods_get_subject, pods_pending_subject, pods_states_subject
from schemas.pods import InvalidPodUID, validate_pod_uid
from services.watcher import answers, observe, states
from services.watcher.decide import Seen
from services.watcher.kube import Kube, KubeError
from services.watcher.pods import Resources
from services.watcher.sync import Sync
from services.watcher.view import PodView

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Queries:
    kube: Kube
    view: PodView
    sync: Sync
    resources: Resources

    def endpoints(self) -> list[Endpoint]:
        node = self.kube.node
        return [
            Endpoint("pods-get", pods_get_subject(node), PodsGet, self.pods_get),
            Endpoint("pods-pending", pods_pending_subject(node), PendingPodsQuery,
                     self.pods_pending),
            Endpoint("pods-states", pods_states_subject(node), PodsStates, self.pods_states),
        ]

    async def pods_states(self, query: PodsStates) -> PodsStatesReply:
        return await states.pods_states(self.view, self.sync, self.kube.node, query)

    async def pods_get(self, query: PodsGet) -> PodsGetReply:
        try:
            uid = validate_pod_uid(query.uid)
        except InvalidPodUID as exc:
            return answers.unknown(query.uid[:80], f"{exc}; nothing was looked up")
        record = await self.view.settled(uid)
        if record is None:
            return await self._look_up_unknown(uid)
        if query.fresh and record.state != "gone":
            return await self._confirm(record)
        return answers.known(record, "from the watcher's view")

    async def _look_up_unknown(self, uid: str) -> PodsGetReply:
        """A UID never seen: LIST afresh rather than guess. Absence from the LIST is `unknown`
        (a Pod never seen cannot be shown to have existed here)."""
        try:
            rv = await self.sync.relist()
        except KubeError as exc:
            return answers.unknown(uid, f"never seen by the watcher; the API server could not "
                                        f"be asked ({exc})")
        record = self.view.get(uid)
        if record is not None:
            return answers.known(record, f"found by a LIST at resourceVersion {rv}")
        return answers.unknown(
            uid, f"not among the Pods the API server lists on node {self.kube.node} at "
                 f"resourceVersion {rv}, and never seen by the watcher", rv,
        )

    async def _confirm(self, record: PodRecord) -> PodsGetReply:
        """GET the Pod by the name the record knows, apply what it shows, answer from the view."""
        try:
            answer = await self.kube.get_pod(record.namespace, record.name)
        except KubeError as exc:
            return answers.known(record, f"not confirmed: {exc}")
        readings = observe.from_get(record, answer, node=self.kube.node, resources=self.resources)
        if readings.skipped:
            skipped = readings.skipped[0]
            log.warning("GET for Pod %s returned %s; not confirmed, nothing changes", record.uid,
                        skipped, extra={"pod_uid": record.uid})
            return answers.known(record, f"not confirmed: the GET returned {skipped}")
        for observation in readings.observations:
            await self.view.apply(observation)
        current = self.view.get(record.uid) or record
        seen = [o for o in readings.observations if isinstance(o, Seen)]
        if current.state == "gone" or not seen:
            return answers.known(current)
        rv = seen[0].pod.resource_version
        return answers.known(current, f"confirmed by a GET at resourceVersion {rv}")

    async def pods_pending(self, query: PendingPodsQuery) -> PendingPodsReply:
        if query.fresh:
            try:
                await self.sync.relist()
            except KubeError as exc:
                log.warning("pods.pending asked for a fresh LIST, which failed (%s); answering "
                            "from the watcher's view at resourceVersion %s", exc,
                            self.view.resource_version)
        chosen = answers.pending(await self.view.settled_records(), query.resource,
                                 query.quantity)
        return PendingPodsReply(pods=chosen, resource_version=self.view.resource_version)
