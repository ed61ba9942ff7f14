"""What the simulated kubelet's status writes say about the containers, beside the phase.

kubelet's status manager writes each container's state (`containerStatuses`, from
`convertToAPIContainerStatuses` in pkg/kubelet/kubelet_pods.go), the Pod's conditions
(`Initialized`, `ContainersReady`, `Ready`, `PodScheduled`, from pkg/kubelet/status/generate.go)
and its IPs; `kubectl get pods` prints READY and STATUS from them. The sim runs no containers,
so their state follows the Pod's phase: Pending is waiting (`ContainerCreating`, or the reason
the kubelet gave), Running is running and ready, Succeeded is terminated with exit 0
(`Completed`), Failed terminated with 1 (`Error`). A Pod the kubelet rejected at admission
(Failed with a reason, its containers never created) gets no container statuses, as upstream.
Each container's `allocatedResourcesStatus` (its devices' health, resourcehealth.py) is written
with the rest, when the kubelet has any for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from partkeeper_sim.kubelet.pods import PodView

IMAGE_ID = ""  # no image is pulled


def pod_ip(uid: str) -> str:
    """A stable address per Pod in a private range, as a CNI plugin would hand out."""
    digest = hashlib.sha256(uid.encode()).digest()
    return f"10.88.{digest[0]}.{max(1, digest[1])}"


def _state(phase: str, reason: str, started: str, now: str) -> tuple[dict[str, Any], bool]:
    if phase == "Running":
        return {"running": {"startedAt": started}}, True
    if phase == "Succeeded":
        return {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started,
                               "finishedAt": now}}, False
    if phase == "Failed":
        return {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": started,
                               "finishedAt": now}}, False
    return {"waiting": {"reason": reason or "ContainerCreating"}}, False


def status_fields(pod: PodView, phase: str, reason: str, started: str | None = None,
                  now: datetime | None = None,
                  allocated: Mapping[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The `status` fields written with `phase` (merged into the phase, reason and message)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    started = started or stamp
    fields: dict[str, Any] = {"hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
                              "startTime": started}
    if phase == "Failed" and reason:  # rejected at admission: nothing ran
        return fields
    ip = pod_ip(pod.uid)
    fields.update(podIP=ip, podIPs=[{"ip": ip}])
    state, ready = _state(phase, reason, started, stamp)
    fields["containerStatuses"] = [
        {"name": c.name, "state": state, "ready": ready, "started": ready, "restartCount": 0,
         "image": "", "imageID": IMAGE_ID, "containerID": f"sim://{pod.uid}/{c.name}"}
        for c in pod.containers
    ]
    for status in fields["containerStatuses"]:
        if (allocated or {}).get(status["name"]):
            status["allocatedResourcesStatus"] = allocated[status["name"]]  # type: ignore[index]
    done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started,
                           "finishedAt": started}}
    if pod.init_containers and phase != "Pending":
        fields["initContainerStatuses"] = [
            {"name": c.name, "state": done, "ready": True, "started": False, "restartCount": 0,
             "image": "", "imageID": IMAGE_ID, "containerID": f"sim://{pod.uid}/{c.name}"}
            for c in pod.init_containers
        ]
    up = "True" if ready else "False"
    fields["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
        {"type": "Initialized", "status": "True" if phase != "Pending" else "False",
         "lastTransitionTime": stamp},
        {"type": "ContainersReady", "status": up, "lastTransitionTime": stamp},
        {"type": "Ready", "status": up, "lastTransitionTime": stamp},
    ]
    return fields
