"""Card health in device-plugin mode, through the sim driver's `fail --card` and the real
allocator: a failed card's tokens turn Unhealthy and nothing is placed on it, its Pods are told
(one `CardUnhealthy` audit entry each), a partition-level XID touches only its own Pod, the
application XIDs change nothing, a lost card is left out without failing the other cards, and a
recovered card is offered again. No health event destroys a partition or releases a claim."""

from __future__ import annotations

from nats.js.api import ConsumerConfig, DeliverPolicy
from prometheus_client import REGISTRY

from schemas import CardUnhealthy, Claim, PartitionEvent, decode
from schemas.names import STREAM_PARTITIONS, parts_subject
from tests_support import until
from tests_support.allocator import MIG, Node, node_stack

R1 = MIG + "1g.10gb"
R7 = MIG + "7g.80gb"
TWO = ("H100-80GB", "H100-80GB")


def failed_gauge(card: int, cause: str) -> float:
    return REGISTRY.get_sample_value("partkeeper_card_failed_devices",
                                     {"card": str(card), "cause": cause}) or 0.0


async def told(js, node: str) -> list[CardUnhealthy]:
    """Every CardUnhealthy entry on the allocator's node-wide audit subject."""
    sub = await js.subscribe(parts_subject(node, None), ordered_consumer=True,
                             config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
    found: list[CardUnhealthy] = []
    try:
        info = await js.stream_info(STREAM_PARTITIONS, subjects_filter=parts_subject(node, None))
        count = (info.state.subjects or {}).get(parts_subject(node, None), 0)
        for _ in range(count):
            msg = await sub.next_msg(timeout=5)
            event = decode(msg.data, PartitionEvent)
            if isinstance(event, CardUnhealthy):
                found.append(event)
    finally:
        await sub.unsubscribe()
    return found


async def running(n: Node, name: str, resource: str = R1) -> tuple[str, Claim]:
    uid = await n.add_pod(name, {"main": {resource: 1}})
    await n.phase(uid, "Running")
    [claim] = await n.claims_of(uid)
    return uid, claim


async def unchanged(n: Node, claims: list[Claim]) -> None:
    """A health event never destroys a partition nor releases a claim: the claims are as they
    were, and their partitions still exist."""
    now = {c.id: c for c in await n.claims()}
    for claim in claims:
        assert now[claim.id].state == claim.state == "active", now.get(claim.id)
        assert claim.instance is not None
        present = {i.uuid for i in await n.instances(claim.card)}
        assert claim.instance.uuid in present


async def test_a_fatal_xid_takes_the_card_out_and_tells_its_pods(nc, js, node) -> None:
    async with node_stack(nc, node, cards=TWO) as n:
        await n.wait_healthy(R1, 14)
        a, claim_a = await running(n, "a")
        assert claim_a.card == 0
        n.sim.fail_card(0, 48)
        # a's token goes Unhealthy, and only card 1's room counts: 7 of 14 Healthy.
        await n.wait_healthy(R1, 7)
        assert n.devices(R1)[claim_a.device_ids[0]] != "Healthy"
        await n.wait_healthy(R7, 1)
        await until(lambda: failed_gauge(0, "xid-48") == 1, "the card's failure is a metric")
        _, claim_b = await running(n, "b")
        assert claim_b.card == 1  # never on the failed card, though card 0 is the fuller one
        await unchanged(n, [claim_a, claim_b])

        async def a_told() -> bool:
            return [(e.pod_uid, e.card, e.xid, e.scope) for e in await told(js, node)] == [
                (a, 0, 48, "card")]

        await until(a_told, "Pod a (and only a) is told its card failed")
        [entry] = await told(js, node)
        assert "double-bit ECC" in entry.meaning and entry.claim_id == claim_a.id


async def test_an_instance_xid_fails_only_its_partition(nc, js, node) -> None:
    async with node_stack(nc, node) as n:
        a, claim_a = await running(n, "a")
        _, claim_b = await running(n, "b")
        assert claim_a.instance is not None
        n.sim.fail_card(0, 94, claim_a.instance.uuid)
        # a's token Unhealthy; b's still Healthy, and the card keeps placing: 5 free + b.
        await n.wait_healthy(R1, 6)
        assert n.devices(R1)[claim_a.device_ids[0]] != "Healthy"
        assert n.devices(R1)[claim_b.device_ids[0]] == "Healthy"
        _, claim_c = await running(n, "c")
        assert claim_c.card == 0
        await until(lambda: told(js, node), "an entry is published")
        assert [e.pod_uid for e in await told(js, node)] == [a]
        await unchanged(n, [claim_a, claim_b, claim_c])


async def test_application_xids_change_nothing(nc, js, node) -> None:
    async with node_stack(nc, node) as n:
        _, claim_a = await running(n, "a")
        for xid in (13, 31, 43, 45, 68, 109):
            n.sim.fail_card(0, xid)
        await until(lambda: (REGISTRY.get_sample_value(
            "partkeeper_card_events_total", {"card": "0", "cause": "xid-109"}) or 0) >= 1,
            "the last application XID was read")
        await n.wait_healthy(R1, 7)
        _, claim_b = await running(n, "b")
        assert claim_b.card == 0
        assert await told(js, node) == []
        await unchanged(n, [claim_a, claim_b])


async def test_a_lost_card_is_left_out_and_offered_again_once_recovered(nc, js, node) -> None:
    async with node_stack(nc, node, cards=TWO) as n:
        a, claim_a = await running(n, "a")
        n.sim.fail_card(0, 79)  # fallen off the bus: every call on card 0 fails
        await n.wait_healthy(R1, 7)
        await until(lambda: failed_gauge(0, "lost") == 1, "the lost card is a metric")
        _, claim_b = await running(n, "b")
        assert claim_b.card == 1
        # The lost card's claim is untouched: a health event releases nothing.
        [still] = await n.claims_of(a)
        assert (still.state, still.id) == ("active", claim_a.id)
        await until(lambda: told(js, node), "Pod a is told")
        [entry] = await told(js, node)
        assert (entry.pod_uid, entry.cause, entry.xid) == (a, "lost", 79)
        n.sim.recover_card(0)
        # Card 0 answers again, empty (a reset clears it); a's claim still covers its slot
        # until the reclaimer removes it, so 6 of card 0's room counts, plus card 1's 6.
        await n.wait_healthy(R1, 1 + 1 + 6 + 6)
        await until(lambda: failed_gauge(0, "lost") == 0, "the gauge is back to 0")


def test_status_names_a_failed_card_and_a_failed_partition() -> None:
    from partkeeper.status import health_lines

    lost = {"health": "lost", "cause": "lost", "meaning": "the card stopped answering",
            "failed_instances": []}
    assert health_lines(lost) == [
        "  LOST: lost (the card stopped answering); nothing new is placed on it"]
    one = {"health": "ok", "failed_instances": ["MIG-1"]}
    assert health_lines(one) == [
        "  FAILED partition MIG-1: its Pod was told; the card keeps serving"]
    assert health_lines({"health": "ok"}) == []


async def test_the_operators_switches_ignore_an_xid(nc, js, node) -> None:
    """PK_HEALTH_IGNORE_XIDS=48: XID 48 is counted and fails nothing; XID 79 still loses it."""
    async with node_stack(nc, node, cards=TWO, settings={"health_ignore_xids": "48"}) as n:
        seen = REGISTRY.get_sample_value("partkeeper_card_events_total",
                                         {"card": "1", "cause": "xid-48"}) or 0.0
        n.sim.fail_card(1, 48)
        await until(lambda: (REGISTRY.get_sample_value(
            "partkeeper_card_events_total", {"card": "1", "cause": "xid-48"}) or 0) > seen,
            "XID 48 was read")
        await n.wait_healthy(R1, 14)
        n.sim.fail_card(1, 79)
        await n.wait_healthy(R1, 7)
