"""What the bus tests share: a Pod UID, a PodGone and a consumer runner on PK_PODS."""

from __future__ import annotations

from partkeeper.bus import ConsumerRunner
from schemas import PodEvent, PodGone, decode
from schemas.names import STREAM_PODS, ConsumerSpec, dlq_subject, pods_filter

UID = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"


def gone(node: str, uid: str = UID) -> PodGone:
    return PodGone(
        node=node, uid=uid, namespace="d", name="p", resource_version="3", observed_at=1.0,
        evidence="deleted",
    )


def runner(js, node: str, handle, *, spec: ConsumerSpec | None = None, name: str = "t"):
    return ConsumerRunner(
        js,
        service=name,
        stream=STREAM_PODS,
        durable=f"{name}-{node.replace('.', '_')}",
        filter_subject=pods_filter(node),
        decode=lambda data: decode(data, PodEvent, what="pod event"),
        handle=handle,
        dlq_subject=dlq_subject(node, name),
        spec=spec or ConsumerSpec(ack_wait_seconds=2, max_deliver=3),
    )
