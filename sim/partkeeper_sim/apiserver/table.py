"""Server-side Table responses (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), which
`kubectl get` asks for and prints column by column.

The columns and cells are the real server's, from kubernetes/pkg/printers/internalversion/
printers.go (`printPod`, `printNode`, `printEvent`, `printResourceSlice`, `printResourceClaim`),
printed as the API server prints them: every column, wide ones included (priority 1, which
`kubectl get` shows with `-o wide`), ages as apimachinery's `duration.HumanDuration` writes them.
Kinds without a printer get the generic convertor's Name and Created At
(apiserver/pkg/registry/rest/table.go). Rows carry the object's metadata as
`PartialObjectMetadata` unless `includeObject` says otherwise (`Object`, `None`).

A middleware: the resource handlers answer as usual and the JSON they return is converted here,
so the store and the handlers know nothing of Tables. Watches (streamed) are left as they are.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from .http import Handler

Row = list[Any]
Column = dict[str, Any]


def _col(name: str, description: str, *, priority: int = 0, fmt: str = "",
         kind: str = "string") -> Column:
    return {"name": name, "type": kind, "format": fmt, "description": description,
            "priority": priority}


NAME = _col("Name", "Name must be unique within a namespace.", fmt="name")
AGE = _col("Age", "CreationTimestamp is a timestamp representing the server time when this "
           "object was created.")


def wants_table(accept: str) -> bool:
    """Whether the client asks for a meta.k8s.io Table (v1 or v1beta1)."""
    return any("as=Table" in part and "g=meta.k8s.io" in part for part in accept.split(","))


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, hours // 24 % 365
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{hours // 24 // 365}y"


def since(stamp: str | None, now: datetime) -> str:
    """translateTimestampSince: "<unknown>" for no time."""
    if not stamp:
        return "<unknown>"
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return human_duration((now - when).total_seconds())


# -- Pods ------------------------------------------------------------------------------------

POD_COLUMNS = [
    NAME,
    _col("Ready", "The aggregate readiness state of this pod for accepting traffic."),
    _col("Status", "The aggregate status of the containers in this pod."),
    _col("Restarts", "The number of times the containers in this pod have been restarted and "
         "when the last container in this pod has restarted."),
    AGE,
    _col("IP", "podIP address allocated to the pod.", priority=1),
    _col("Node", "NodeName indicates in which node this pod is scheduled.", priority=1),
    _col("Nominated Node", "nominatedNodeName is set when this pod preempts other pods on the "
         "node.", priority=1),
    _col("Readiness Gates", "If specified, all readiness gates will be evaluated for pod "
         "readiness.", priority=1),
]


def _pod_reason(pod: dict[str, Any]) -> tuple[str, int, int]:
    """(STATUS, ready containers, restarts), as printPod derives them."""
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    reason = status.get("reason") or status.get("phase") or ""
    restarts = ready = 0
    initializing = False
    inits = spec.get("initContainers") or []
    for i, c in enumerate(status.get("initContainerStatuses") or []):
        restarts += int(c.get("restartCount") or 0)
        state = c.get("state") or {}
        done, waiting = state.get("terminated"), state.get("waiting")
        if done is not None and int(done.get("exitCode") or 0) == 0:
            continue
        if done is not None:
            reason = "Init:" + (done.get("reason") or f"ExitCode:{done.get('exitCode', 0)}")
        elif waiting and waiting.get("reason") not in (None, "", "PodInitializing"):
            reason = "Init:" + waiting["reason"]
        else:
            reason = f"Init:{i}/{len(inits)}"
        initializing = True
        break
    if not initializing:
        running = False
        for c in reversed(status.get("containerStatuses") or []):
            restarts += int(c.get("restartCount") or 0)
            state = c.get("state") or {}
            waiting, done = state.get("waiting"), state.get("terminated")
            if waiting and waiting.get("reason"):
                reason = waiting["reason"]
            elif done and done.get("reason"):
                reason = done["reason"]
            elif done is not None:
                reason = f"ExitCode:{done.get('exitCode', 0)}"
            elif c.get("ready") and state.get("running") is not None:
                running = True
                ready += 1
        if reason == "Completed" and running:
            ready_cond = any(x.get("type") == "Ready" for x in status.get("conditions") or [])
            reason = "Running" if ready_cond else "NotReady"
    terminal = status.get("phase") in ("Succeeded", "Failed")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else (
            reason if terminal else "Terminating")
    return reason, ready, restarts


def pod_row(pod: dict[str, Any], now: datetime) -> Row:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    reason, ready, restarts = _pod_reason(pod)
    ips = status.get("podIPs") or []
    gates = spec.get("readinessGates") or []
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    passed = sum(1 for g in gates if conditions.get(g.get("conditionType")) == "True")
    return [
        pod["metadata"]["name"], f"{ready}/{len(spec.get('containers') or [])}", reason,
        str(restarts), since(pod["metadata"].get("creationTimestamp"), now),
        (ips[0].get("ip") if ips else "") or status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>",
        f"{passed}/{len(gates)}" if gates else "<none>",
    ]


# -- Nodes -----------------------------------------------------------------------------------

NODE_COLUMNS = [
    NAME,
    _col("Status", "The status of the node"),
    _col("Roles", "The roles of the node"),
    AGE,
    _col("Version", "Kubelet Version reported by the node."),
    _col("Internal-IP", "List of addresses reachable to the node. Queried from cloud provider, "
         "if available.", priority=1),
    _col("External-IP", "List of addresses reachable to the node. Queried from cloud provider, "
         "if available.", priority=1),
    _col("OS-Image", "OS Image reported by the node from /etc/os-release (e.g. Debian "
         "GNU/Linux 7 (wheezy)).", priority=1),
    _col("Kernel-Version", "Kernel Version reported by the node from 'uname -r' (e.g. "
         "3.16.0-0.bpo.4-amd64).", priority=1),
    _col("Container-Runtime", "ContainerRuntime Version reported by the node through runtime "
         "remote API (e.g. containerd://1.4.2).", priority=1),
]


def node_row(node: dict[str, Any], now: datetime) -> Row:
    meta, status = node["metadata"], node.get("status") or {}
    ready = {c.get("type"): c.get("status") for c in status.get("conditions") or []}.get("Ready")
    states = [{"True": "Ready", "False": "NotReady"}.get(ready or "", "Unknown")]
    if (node.get("spec") or {}).get("unschedulable"):
        states.append("SchedulingDisabled")
    labels = meta.get("labels") or {}
    roles = {k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/")}
    if labels.get("kubernetes.io/role"):
        roles.add(labels["kubernetes.io/role"])
    info = status.get("nodeInfo") or {}

    def address(kind: str) -> str:
        found = [a["address"] for a in status.get("addresses") or [] if a.get("type") == kind]
        return found[0] if found else "<none>"

    return [
        meta["name"], ",".join(states), ",".join(sorted(roles)) or "<none>",
        since(meta.get("creationTimestamp"), now), info.get("kubeletVersion", ""),
        address("InternalIP"), address("ExternalIP"), info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


# -- core Events -----------------------------------------------------------------------------

EVENT_COLUMNS = [
    _col("Last Seen", "The time at which the most recent occurrence of this event was "
         "recorded."),
    _col("Type", "Type of this event (Normal, Warning), new types could be added in the "
         "future"),
    _col("Reason", "This should be a short, machine understandable string that gives the "
         "reason for the transition into the object's current status."),
    _col("Object", "The object that this event is about."),
    _col("Subobject", "If referring to a piece of an object instead of an entire object, this "
         "string should contain a valid JSON/Go field access statement", priority=1),
    _col("Source", "The component reporting this event.", priority=1),
    _col("Message", "A human-readable description of the status of this operation."),
    _col("First Seen", "The time at which the event was first recorded.", priority=1),
    _col("Count", "The number of times this event has occurred.", priority=1),
    _col("Name", "Name must be unique within a namespace.", priority=1, fmt="name"),
]


def event_row(event: dict[str, Any], now: datetime) -> Row:
    first = since(event.get("firstTimestamp") or event.get("eventTime"), now)
    last = since(event["lastTimestamp"], now) if event.get("lastTimestamp") else first
    count = event.get("count") or 1
    if series := event.get("series"):
        last, count = since(series.get("lastObservedTime"), now), series.get("count", count)
    target = event.get("involvedObject") or {}
    kind = str(target.get("kind", "")).lower()
    source = event.get("source") or {}
    component = source.get("component") or event.get("reportingComponent") or ""
    host = source.get("host") or event.get("reportingInstance") or ""
    return [
        last, event.get("type", ""), event.get("reason", ""),
        f"{kind}/{target['name']}" if target.get("name") else kind,
        target.get("fieldPath", ""), ", ".join(p for p in (component, host) if p),
        str(event.get("message", "")).strip(), first, int(count), event["metadata"]["name"],
    ]


# -- resource.k8s.io -------------------------------------------------------------------------

SLICE_COLUMNS = [
    NAME, _col("Node", "The node this slice belongs to."),
    _col("Driver", "The driver that publishes this slice."),
    _col("Pool", "The pool of devices this slice is part of."), AGE,
]


def slice_row(obj: dict[str, Any], now: datetime) -> Row:
    spec = obj.get("spec") or {}
    return [obj["metadata"]["name"], spec.get("nodeName", ""), spec.get("driver", ""),
            (spec.get("pool") or {}).get("name", ""),
            since(obj["metadata"].get("creationTimestamp"), now)]


CLAIM_COLUMNS = [NAME, _col("State", "A summary of the current state (allocated, pending, "
                            "reserved, etc.)."), AGE]


def claim_row(obj: dict[str, Any], now: datetime) -> Row:
    meta, status = obj["metadata"], obj.get("status") or {}
    states = ["deleted"] if meta.get("deletionTimestamp") else []
    if status.get("allocation") is None:
        states += [] if meta.get("deletionTimestamp") else ["pending"]
    else:
        states.append("allocated")
        states += ["reserved"] if status.get("reservedFor") else []
    return [meta["name"], ",".join(states), since(meta.get("creationTimestamp"), now)]


DEFAULT_COLUMNS = [NAME, _col("Created At", "CreationTimestamp is a timestamp representing "
                              "the server time when this object was created.", kind="date")]


def default_row(obj: dict[str, Any], _now: datetime) -> Row:
    meta = obj.get("metadata") or {}
    return [meta.get("name", ""), meta.get("creationTimestamp", "")]


PRINTERS: dict[tuple[str, str], tuple[list[Column], Callable[[dict[str, Any], datetime], Row]]] = {
    ("v1", "Pod"): (POD_COLUMNS, pod_row),
    ("v1", "Node"): (NODE_COLUMNS, node_row),
    ("v1", "Event"): (EVENT_COLUMNS, event_row),
    ("resource.k8s.io/v1", "ResourceSlice"): (SLICE_COLUMNS, slice_row),
    ("resource.k8s.io/v1", "ResourceClaim"): (CLAIM_COLUMNS, claim_row),
}


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata") or {}}


def to_table(body: dict[str, Any], include: str = "PartialObjectMetadata",
             now: datetime | None = None) -> dict[str, Any] | None:
    """The Table of a list or of one object; None when `body` is neither (a Status, say)."""
    now = now or datetime.now(UTC)
    kind, api_version = str(body.get("kind", "")), str(body.get("apiVersion", ""))
    if kind.endswith("List") and isinstance(body.get("items"), list):
        items, kind = body["items"], kind.removesuffix("List")
    elif isinstance(body.get("metadata"), dict) and kind and kind != "Status":
        items = [body]
    else:
        return None
    columns, printer = PRINTERS.get((api_version, kind), (DEFAULT_COLUMNS, default_row))
    rows = []
    for item in items:
        row: dict[str, Any] = {"cells": printer(item, now)}
        if (shown := _row_object(item, include)) is not None:
            row["object"] = shown
        rows.append(row)
    rv = (body.get("metadata") or {}).get("resourceVersion", "")
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": rv} if rv else {}, "columnDefinitions": columns,
            "rows": rows}


@web.middleware
async def tables(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    if (request.method != "GET" or not wants_table(request.headers.get("Accept", ""))
            or not isinstance(response, web.Response) or response.status != 200
            or response.content_type != "application/json" or response.body is None):
        return response
    body = json.loads(bytes(response.body))  # type: ignore[arg-type]
    if not isinstance(body, dict):
        return response
    table = to_table(body, request.query.get("includeObject", "PartialObjectMetadata"))
    if table is None:
        return response
    return web.json_response(table)
