"""The node says who enforces its logical slices: a label and an annotation on its Node.

`partkeeper.io/slices-enforced` (a label, `true` or `false`, so `kubectl get nodes
-l partkeeper.io/slices-enforced=false` finds the nodes whose slices nothing holds to their
share) and `partkeeper.io/slice-limiter` (an annotation with the sentence). The watcher writes
them because it is the service that talks to the API server; `PK_SLICE_LIMITER` comes from the
ConfigMap every container reads, and the allocator refuses to start when a configured limiter's
files are missing, so the configured limiter is the one the slices get. Written at start and
again every `period` (a JSON merge patch of the Node's metadata: an operator's removal is
undone, nothing else on the Node is touched); failures are retried with backoff and never stop
the watcher.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubernetes.client.exceptions import ApiException

from partkeeper import backoff
from partkeeper.limiter import NONE
from services.watcher.kube import Kube

log = logging.getLogger(__name__)

LABEL = "partkeeper.io/slices-enforced"
CARD_HEALTH = "partkeeper.io/card-{index}-health"
ANNOTATION = "partkeeper.io/slice-limiter"
MERGE_PATCH = "application/merge-patch+json"


def note(limiter: str) -> dict[str, Any]:
    """The Node metadata patch for `limiter` (`none` or `hami-core`). Pure."""
    enforced = limiter != NONE
    said = (f"logical slices are enforced by {limiter}" if enforced else
            "logical slices are NOT enforced (PK_SLICE_LIMITER=none): a container can use the "
            "whole card")
    return {"metadata": {"labels": {LABEL: "true" if enforced else "false"},
                         "annotations": {ANNOTATION: said}}}


def card_note(card: int, health: str, cause: str, meaning: str) -> dict[str, Any]:
    """The Node metadata patch for one card's health (pure): `failed: xid-48 (...)` or
    `lost: ...` while it takes no partition; removed (null in a merge patch) once it is ok."""
    key = CARD_HEALTH.format(index=card)
    said = None if health == "ok" else f"{health}: {cause} ({meaning}); takes no new partition"
    return {"metadata": {"annotations": {key: said}}}


async def note_card(kube: Kube, body: dict[str, Any]) -> None:
    """Patch the Node once (the entry that asked is retried by its consumer on failure)."""
    await asyncio.to_thread(kube.api.patch_node, kube.node, body, _content_type=MERGE_PATCH,
                            _request_timeout=kube.request_timeout)


async def keep(kube: Kube, limiter: str, period: float = 600.0) -> None:
    """Write the note now and every `period` seconds, until cancelled; a failure never stops the
    watcher (the note is advice), it is tried again with backoff."""
    body = note(limiter)
    written = False

    async def write() -> backoff.Again | None:
        nonlocal written
        try:
            await asyncio.to_thread(kube.api.patch_node, kube.node, body,
                                    _content_type=MERGE_PATCH,
                                    _request_timeout=kube.request_timeout)
        except Exception as exc:
            why = "no RBAC permission to patch nodes" if isinstance(exc, ApiException) \
                and exc.status == 403 else repr(exc)
            return backoff.Again(why)
        if not written:
            log.info("Node %s labelled %s=%s", kube.node, LABEL, body["metadata"]["labels"][LABEL])
        written = True
        return None

    await backoff.every(f"labelling Node {kube.node} with the slice enforcement", period, write,
                        schedule=backoff.Schedule(base=1.0, cap=period))
