"""The answers of `pods.get` and `pods.pending`, as functions of the view (pure)."""

from __future__ import annotations

from collections.abc import Iterable

from schemas import PodRecord, PodsGetReply


def known(record: PodRecord, note: str = "") -> PodsGetReply:
    """The record's state with its evidence; `note` says how fresh the answer is."""
    evidence = f"{record.evidence}; {note}" if note else record.evidence
    return PodsGetReply(
        uid=record.uid,
        state=record.state,
        evidence=evidence,
        resource_version=record.resource_version,
        pod=record,
    )


def unknown(uid: str, evidence: str, resource_version: str = "") -> PodsGetReply:
    return PodsGetReply(
        uid=uid, state="unknown", evidence=evidence, resource_version=resource_version
    )


def pending(records: Iterable[PodRecord], resource: str, quantity: int) -> list[PodRecord]:
    """Live, not terminating, Pending Pods with a container asking exactly `quantity` of
    `resource`, oldest first by (creationTimestamp, namespace, name), as kubelet admits them."""
    chosen = [
        record
        for record in records
        if record.state == "live"
        and record.phase == "Pending"
        and not record.deleting
        and any(c.requests.get(resource) == quantity for c in record.containers)
    ]
    return sorted(chosen, key=lambda r: (r.created, r.namespace, r.name))
