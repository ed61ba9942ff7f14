"""`partkeeper status [--json]`: cards, partitions, claims and capacity of a node, from NATS only.

The allocator publishes its view of every card (instances, foreign flags, free placements) in the
`pk-capacity` bucket; claims come from `pk-claims`. Which services answer is asked through the
NATS micro-service discovery subjects (`$SRV.PING.<name>`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import nats
import nats.errors
from nats.js.errors import BucketNotFoundError, KeyNotFoundError

from partkeeper.claims import ClaimsStore
from partkeeper.config import ConfigError, load
from schemas import CardClaims, NodeCapacity, SchemaError, decode
from schemas.names import (
    BUCKET_CAPACITY,
    BUCKET_CLAIMS,
    SERVICE_ALLOCATOR,
    SERVICE_RECLAIMER,
    SERVICE_WATCHER,
    capacity_key,
)

MICRO_SERVICES = (SERVICE_WATCHER, SERVICE_ALLOCATOR, SERVICE_RECLAIMER)


class StatusError(Exception):
    """Something status needs could not be read; the message says what and what to check."""


def build(
    node: str, capacity: NodeCapacity, claims: dict[int, CardClaims], services: dict[str, bool]
) -> dict[str, Any]:
    """The status document (DESIGN.md section 4) from the snapshots. Pure."""
    cards = []
    for card in capacity.cards:
        doc = claims.get(card.index)
        by_id = doc.claims if doc else {}
        instances = []
        for inst in card.instances:
            claim = by_id.get(inst.claim_id or "")
            instances.append(
                {
                    "uuid": inst.uuid, "profile": inst.profile, "start": inst.start,
                    "size": inst.size, "gi_id": inst.gi_id, "foreign": inst.foreign,
                    "claim": None if claim is None else
                    {"id": claim.id, "state": claim.state, "pod_uid": claim.pod_uid},
                }
            )
        cards.append(
            {
                "index": card.index, "uuid": card.uuid, "model": card.model, "mode": card.mode,
                "instances": instances,
                "claims": [
                    {"id": c.id, "kind": c.kind, "state": c.state, "pod_uid": c.pod_uid,
                     "namespace": c.namespace, "name": c.name, "container": c.container,
                     "profile": c.profile, "start": c.start, "size": c.size}
                    for c in sorted(by_id.values(), key=lambda c: (c.start, c.id))
                ],
                "free": dict(card.free),
                "pending_reclaims": card.pending_reclaims,
            }
        )
    return {"node": node, "at": capacity.at, "services": services, "cards": cards}


async def gather(node: str, urls: tuple[str, ...], timeout: float = 2.0) -> dict[str, Any]:
    async def quiet(exc: Exception) -> None:
        """The failure is reported once, below, as a sentence."""

    try:
        nc = await asyncio.wait_for(
            nats.connect(
                servers=list(urls), connect_timeout=timeout, max_reconnect_attempts=0,
                allow_reconnect=False, error_cb=quiet,
            ),
            timeout * 2,
        )
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        raise StatusError(f"cannot reach NATS at {','.join(urls)}: {reason}") from exc
    try:
        js = nc.jetstream()
        try:
            kv = await js.key_value(BUCKET_CAPACITY)
            entry = await kv.get(capacity_key(node))
        except (BucketNotFoundError, KeyNotFoundError):
            raise StatusError(
                f"no capacity published for node {node!r}: is the allocator running on it?"
            ) from None
        try:
            capacity = decode(entry.value or b"", NodeCapacity, what="capacity document")
        except SchemaError as exc:
            raise StatusError(str(exc)) from exc
        store = ClaimsStore(await js.key_value(BUCKET_CLAIMS), node)
        docs = await store.read_all([c.index for c in capacity.cards])
        services = {name: await _answers(nc, name, timeout) for name in MICRO_SERVICES}
        return build(node, capacity, {k: v[0] for k, v in docs.items()}, services)
    finally:
        await nc.close()


async def _answers(nc: nats.NATS, service: str, timeout: float) -> bool:
    try:
        await nc.request(f"$SRV.PING.{service}", b"", timeout=timeout)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return False
    return True


def render(status: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    down = [name for name, up in status["services"].items() if not up]
    console.print(f"[bold]node[/bold] {status['node']}")
    if down:
        console.print(f"[red]not answering:[/red] {', '.join(down)}")
    for card in status["cards"]:
        title = f"card {card['index']} {card['model']} ({card['mode']}) {card['uuid']}"
        table = Table(title=title, title_justify="left")
        for col in ("placement", "profile", "instance", "claim", "state", "pod"):
            table.add_column(col)
        for inst in card["instances"]:
            claim = inst["claim"] or {}
            table.add_row(
                f"{inst['start']}+{inst['size']}", inst["profile"], inst["uuid"],
                claim.get("id", "[yellow]foreign[/yellow]" if inst["foreign"] else "-"),
                claim.get("state", "-"), claim.get("pod_uid", "-"),
            )
        owned = {i["claim"]["id"] for i in card["instances"] if i["claim"]}
        for claim in card["claims"]:
            if claim["id"] not in owned:
                table.add_row(
                    f"{claim['start']}+{claim['size']}", claim["profile"], "-", claim["id"],
                    claim["state"], claim["pod_uid"],
                )
        console.print(table)
        free = ", ".join(f"{p}: {n}" for p, n in sorted(card["free"].items())) or "none"
        console.print(f"  free: {free}; pending reclaims: {card['pending_reclaims']}")


def main(args: argparse.Namespace) -> int:
    try:
        config = load()
    except ConfigError as exc:
        print(f"partkeeper status: {exc}", file=sys.stderr)
        return 2
    try:
        status = asyncio.run(gather(config.node, config.nats_urls))
    except StatusError as exc:
        print(f"partkeeper status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        render(status)
    return 0
