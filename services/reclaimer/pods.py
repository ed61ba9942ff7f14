"""Asking the watcher about a Pod (`pods.get`), and the evidence a claim is acted on.

No answer, an error answer or an undecodable answer all become the verdict `no-answer`, which
decides nothing: only the watcher declares a Pod gone or finished.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.client import Client

from partkeeper.bus import NoAnswer, RemoteError, Unanswered
from partkeeper.bus.clients import WatcherClient
from partkeeper.podstate import is_dead
from services.reclaimer.decide import PodVerdict


@dataclass(frozen=True, slots=True)
class Evidence:
    """Why a claim is being looked at: what is known about its Pod, and since when."""

    pod: PodVerdict
    reason: str
    observed_at: float | None = None  # when the watcher observed the death (reclaim latency)

    @property
    def dead(self) -> bool:
        return is_dead(self.pod)


async def ask(nc: Client, node: str, uid: str, *, fresh: bool, timeout: float) -> Evidence:
    """The watcher's verdict on Pod `uid`, as evidence; never raises for a missing answer."""
    try:
        reply = await WatcherClient(nc, node, timeout).pod(uid, fresh=fresh)
    except NoAnswer as exc:
        return Evidence("no-answer", f"the watcher did not answer: {exc}")
    except RemoteError as exc:
        return Evidence("no-answer", f"the watcher answered with an error: {exc}")
    except Unanswered as exc:
        return Evidence("no-answer", f"the watcher's answer could not be used: {exc}")
    observed = reply.pod.updated_at if reply.pod is not None and is_dead(reply.state) else None
    why = f"pods.get{' (fresh)' if fresh else ''}: {reply.state}"
    if reply.evidence:
        why += f" ({reply.evidence})"
    return Evidence(reply.state, why, observed)
