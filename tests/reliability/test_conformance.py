"""Every documented request, sent as literal JSON text as a person with the `nats` CLI would
(`nats --inbox-prefix _INBOX.<node>.admin req pk.<node>.pods.get '{"uid": "...", "fresh": true}'`):
no `v`, no `type`. Each answer is
checked for the fields the contract documents; an error answer carries, besides the micro error
headers, a JSON body {"error": str, "code": int}."""

from __future__ import annotations

import json
from typing import Any

import pytest
from nats.aio.client import Client
from nats.micro.request import ERROR_CODE_HEADER, ERROR_HEADER

from schemas.names import (
    SERVICE_ALLOCATOR,
    SERVICE_RECLAIMER,
    SERVICE_WATCHER,
    claims_query_subject,
    pods_get_subject,
    pods_pending_subject,
    reclaim_now_subject,
)
from tests_support.reliability import scene

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]

UNKNOWN_UID = "00000000-0000-4000-8000-000000000000"


async def ask(nc: Client, subject: str, text: str) -> tuple[dict[str, str], Any]:
    msg = await nc.request(subject, text.encode(), timeout=10.0)
    return dict(msg.headers or {}), json.loads(msg.data)


async def answer(nc: Client, subject: str, text: str) -> dict[str, Any]:
    headers, body = await ask(nc, subject, text)
    assert ERROR_CODE_HEADER not in headers, f"{subject} {text}: {headers} {body}"
    assert body["v"] == 1, body
    return body


async def test_documented_requests_as_literal_json() -> None:
    async with scene() as sc:
        nc, node = sc.rig.stack.nc, sc.rig.stack.node
        pod = await sc.admit("1g.10gb", "conform")
        resource = sc.work.resource("1g.10gb")

        live = await answer(nc, pods_get_subject(node), f'{{"uid": "{pod.uid}", "fresh": true}}')
        assert live["type"] == "PodsGetReply" and live["uid"] == pod.uid
        assert live["state"] == "live" and live["evidence"] and live["resource_version"]
        assert live["pod"]["name"] == pod.name
        unknown = await answer(nc, pods_get_subject(node), f'{{"uid": "{UNKNOWN_UID}"}}')
        assert unknown["uid"] == UNKNOWN_UID and unknown["state"] in ("unknown", "gone")

        pending = await answer(nc, pods_pending_subject(node),
                               f'{{"resource": "{resource}", "quantity": 1}}')
        assert pending["type"] == "PendingPodsReply" and isinstance(pending["pods"], list)
        assert pod.uid not in {p["uid"] for p in pending["pods"]}  # it is Running

        mine = await answer(nc, claims_query_subject(node), f'{{"pod_uid": "{pod.uid}"}}')
        assert mine["type"] == "ClaimsReply" and isinstance(mine["revisions"], dict)
        [claim] = mine["claims"]
        assert claim["pod_uid"] == pod.uid and claim["state"] == "active" and claim["id"]
        every = await answer(nc, claims_query_subject(node), "{}")
        assert claim["id"] in {c["id"] for c in every["claims"]}

        refused = await answer(nc, reclaim_now_subject(node),
                               f'{{"claim_ids": ["{claim["id"]}"], "reason": "by hand"}}')
        assert refused["type"] == "ReclaimNowReply"
        [outcome] = refused["outcomes"]
        assert outcome["claim_id"] == claim["id"] and outcome["done"] is False
        assert outcome["reason"]  # a live Pod's partition is never destroyed on request

        for subject in (pods_get_subject(node), claims_query_subject(node)):
            headers, body = await ask(nc, subject, f'{{"v": 99, "uid": "{pod.uid}"}}')
            assert headers[ERROR_CODE_HEADER] == "400" and "version 99" in headers[ERROR_HEADER]
            assert body == {"error": headers[ERROR_HEADER], "code": 400}

        services: set[str] = set()
        sub = await nc.subscribe(inbox := nc.new_inbox())
        await nc.publish("$SRV.INFO", b"", reply=inbox)
        while len(services) < 3:
            msg = await sub.next_msg(timeout=10.0)
            services.add(json.loads(msg.data)["name"])
        await sub.unsubscribe()
        assert services >= {SERVICE_ALLOCATOR, SERVICE_WATCHER, SERVICE_RECLAIMER}

        await sc.work.delete(pod)
        await sc.check_converged()
