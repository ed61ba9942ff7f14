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

from partkeeper.bus.connection import credentials
from partkeeper.bus.kv import Bucket
from partkeeper.bus.permissions import ADMIN, inbox_prefix
from partkeeper.claims import ClaimsStore
from partkeeper.config import ConfigError, load
from schemas import CardClaims, Claim, NodeCapacity, SchemaError, decode
from schemas.names import (
    BUCKET_CAPACITY,
    BUCKET_CLAIMS,
    SERVICE_ALLOCATOR,
    SERVICE_RECLAIMER,
    SERVICE_WATCHER,
    capacity_key,
    encode_token,
)

MICRO_SERVICES = (SERVICE_WATCHER, SERVICE_ALLOCATOR, SERVICE_RECLAIMER)


class StatusError(Exception):
    """Something status needs could not be read; the message says what and what to check."""


def build(
    node: str, capacity: NodeCapacity, claims: dict[int, CardClaims], services: dict[str, bool]
) -> dict[str, Any]:
    """The status document (docs/contract.md section 4) from the snapshots. Pure.

    Each claim says its `mode`: "dra" when DRA mode wrote it (it names a ResourceClaim),
    "deviceplugin" otherwise; `adopted` when the allocator now runs in the other mode (a node
    switched with its Pods running: the claim is kept and ends as its own mode's do)."""
    running = capacity.allocator_mode

    def modes(claim: Claim) -> dict[str, Any]:
        mode = "dra" if claim.resource_claim_uid else "deviceplugin"
        return {"mode": mode, "adopted": bool(running) and mode != running}

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
                    {"id": claim.id, "state": claim.state, "pod_uid": claim.pod_uid,
                     "resource_claim": claim.resource_claim, **modes(claim)},
                }
            )
        cards.append(
            {
                "index": card.index, "uuid": card.uuid, "model": card.model, "mode": card.mode,
                "instances": instances,
                "claims": [
                    {"id": c.id, "kind": c.kind, "state": c.state, "pod_uid": c.pod_uid,
                     "namespace": c.namespace, "name": c.name, "container": c.container,
                     "profile": c.profile, "start": c.start, "size": c.size,
                     "resource_claim": c.resource_claim, **modes(c),
                     # docs/operations.md, "After a reboot": its partition gone, holding no room
                     "rebooted": c.rebooted, "remakes": c.remakes}
                    for c in sorted(by_id.values(), key=lambda c: (c.start, c.id))
                ],
                "free": dict(card.free),
                "pending_reclaims": card.pending_reclaims,
                "health": card.health, "cause": card.cause, "meaning": card.meaning,
                "failed_instances": list(card.failed_instances),
            }
        )
    return {"node": node, "at": capacity.at, "services": services, "cards": cards,
            "slice_limiter": _limiter(capacity), "allocator_mode": running or None}


def _limiter(capacity: NodeCapacity) -> dict[str, Any] | None:
    """Who enforces the logical slices; None when the allocator is older than this report."""
    found = capacity.slice_limiter
    if found is None:
        return None
    return {"name": found.name, "enforced": found.enforced, "dir": found.dir,
            "missing": list(found.missing)}


def limiter_line(found: dict[str, Any] | None) -> str:
    """One line on slice enforcement, as status and the demo's summary print it. Pure."""
    if found is None:
        return "slices: enforcement unknown (the allocator does not report it)"
    if found["enforced"]:
        return f"slices enforced by {found['name']} (files in {found['dir']})"
    if found["name"] == "none":
        return ("slices NOT enforced: no slice limiter (PK_SLICE_LIMITER=none); a container can "
                "use the whole card")
    return (f"slices NOT enforced: {found['name']} is configured but "
            f"{', '.join(found['missing'])} missing")


async def gather(
    node: str, urls: tuple[str, ...], timeout: float = 2.0, *, auth: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Read the status of `node`; `auth` is nats.connect's credentials (bus.credentials)."""

    async def quiet(exc: Exception) -> None:
        """The failure is reported once, below, as a sentence."""

    try:
        nc = await asyncio.wait_for(
            nats.connect(
                servers=list(urls), connect_timeout=timeout, max_reconnect_attempts=0,
                allow_reconnect=False, error_cb=quiet,
                # the operators' inbox: the services answer there and nowhere else
                inbox_prefix=inbox_prefix(ADMIN, encode_token(node)), **(auth or {}),
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
        store = ClaimsStore(await Bucket.open(js, BUCKET_CLAIMS), node)
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


COLUMNS = ("placement", "profile", "instance", "claim", "mode", "state", "pod")
_MODES = {"deviceplugin": "device-plugin", "dra": "DRA"}


def render(status: dict[str, Any]) -> str:
    """The status as plain text tables (no terminal library: the agent image has none). Pure."""
    mode = status.get("allocator_mode")
    lines = [f"node {status['node']}" + (f" (allocator in {_MODES[mode]} mode)" if mode else "")]
    down = [name for name, up in status["services"].items() if not up]
    if down:
        lines.append(f"not answering: {', '.join(down)}")
    for card in status["cards"]:
        lines.append(f"card {card['index']} {card['model']} ({card['mode']}) {card['uuid']}")
        lines.extend(_table(COLUMNS, _rows(card)))
        free = ", ".join(f"{p}: {n}" for p, n in sorted(card["free"].items())) or "none"
        lines.append(f"  free: {free}; pending reclaims: {card['pending_reclaims']}")
        lines.extend(health_lines(card))
    if any(card["mode"] == "sliced" for card in status["cards"]):
        lines.append(limiter_line(status.get("slice_limiter")))
    return "\n".join(lines)


def health_lines(card: dict[str, Any]) -> list[str]:
    """A failed card's line (and one per partition that failed by itself). Pure."""
    lines = []
    if card.get("health", "ok") != "ok":
        lines.append(f"  {card['health'].upper()}: {card.get('cause') or 'unknown cause'} "
                     f"({card.get('meaning') or 'no detail'}); nothing new is placed on it")
    for uuid in card.get("failed_instances") or []:
        lines.append(f"  FAILED partition {uuid}: its Pod was told; the card keeps serving")
    return lines


def _rows(card: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for inst in card["instances"]:
        claim = inst["claim"] or {}
        rows.append((
            f"{inst['start']}+{inst['size']}", inst["profile"], inst["uuid"],
            _claim_label(claim, inst["foreign"]), _mode_label(claim), claim.get("state", "-"),
            claim.get("pod_uid", "-"),
        ))
    owned = {i["claim"]["id"] for i in card["instances"] if i["claim"]}
    rows.extend(
        (f"{c['start']}+{c['size']}", c["profile"], "-", _claim_label(c, False), _mode_label(c),
         c["state"] + (" (rebooted)" if c.get("rebooted") else ""), c["pod_uid"])
        for c in card["claims"] if c["id"] not in owned
    )
    return rows


def _mode_label(claim: dict[str, Any]) -> str:
    """`device-plugin` or `DRA`, `(adopted)` when the allocator runs in the other mode."""
    if not claim or "mode" not in claim:
        return "-"
    return _MODES[claim["mode"]] + (" (adopted)" if claim.get("adopted") else "")


def _claim_label(claim: dict[str, Any], foreign: bool) -> str:
    """The claim's id, or in DRA mode the ResourceClaim it was prepared for."""
    if not claim:
        return "foreign" if foreign else "-"
    return claim.get("resource_claim") or claim["id"]


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
            for r in (header, *rows)]


def main(args: argparse.Namespace) -> int:
    try:
        config = load()
    except ConfigError as exc:
        print(f"partkeeper status: {exc}", file=sys.stderr)
        return 2
    try:
        status = asyncio.run(gather(config.node, config.nats_urls, auth=credentials(config)))
    except StatusError as exc:
        print(f"partkeeper status: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(status, indent=2))
    else:
        print(render(status))
    return 0
