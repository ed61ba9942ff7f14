"""The "Pods on partitions" panel (deploy/grafana/partkeeper.json) against the series: its PromQL
names only labels `partkeeper_partition_info`, the DCGM exporter's MIG series and the scrape
carry, and its join, evaluated over a sample of each (tests_support/dcgm.py says where the DCGM
labels come from), gives every partition its Pod and its DCGM value."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from partkeeper.drivers import Instance
from partkeeper.telemetry.partitions import LABELS, PartitionInfo, User, series
from schemas import Claim, LiveInstance
from tests_support import UID, dcgm
from tests_support.manifests import DEPLOY

CARD0 = "GPU-5a2b7c1d-0000-4000-8000-000000000000"
CARD1 = "GPU-5a2b7c1d-1111-4000-8000-111111111111"
MODEL = "NVIDIA H100 80GB HBM3"
# Scrape labels of the node agent's PodMonitor (deploy/components/podmonitor).
SCRAPE = {"node": "node-1"}
FIELD = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


def _panel() -> dict[str, Any]:
    dashboard = json.loads((DEPLOY / "grafana" / "partkeeper.json").read_text())
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    [panel] = [p for p in panels if p["title"] == "Pods on partitions"]
    return panel


def _join_expr() -> str:
    [expr] = [t["expr"] for t in _panel()["targets"] if "group_left" in t["expr"]]
    return expr


def _claim(cid: str, card: int, gi: int, mig: str, *, name: str, container: str,
           rc_uid: str = "") -> Claim:
    return Claim(
        id=cid, state="active", pod_uid=UID, namespace="ml", name=name, container=container,
        resource="nvidia.com/mig-1g.10gb", device_ids=[cid], card=card, profile="1g.10gb",
        start=gi, size=1, instance=LiveInstance(gi_id=gi, ci_id=0, uuid=mig), created_at=0,
        updated_at=0, resource_claim_uid=rc_uid, resource_claim="ml/shared" if rc_uid else "",
    )


def _inst(card: int, gi: int, mig: str) -> Instance:
    return Instance(card=card, profile="1g.10gb", start=gi, size=1, gi_id=gi, ci_id=0, uuid=mig)


@pytest.fixture
def info() -> list[dcgm.Sample]:
    """The allocator's series as Prometheus stores them: a device-plugin partition on card 0, a
    DRA partition on card 1 shared by two Pods; scraped, so `node` is added."""
    claims = [_claim("dp", 0, 9, "MIG-aaaa", name="train-0", container="main"),
              _claim("dra", 1, 9, "MIG-bbbb", name="infer-a", container="gpu", rc_uid="rc-1")]
    instances = {0: (_inst(0, 9, "MIG-aaaa"),), 1: (_inst(1, 9, "MIG-bbbb"),)}
    users = {"rc-1": [User("ml", "infer-a", "server"), User("ml", "infer-b", "server")]}
    registry = CollectorRegistry()
    PartitionInfo(Gauge("partkeeper_partition_info", "t", list(LABELS), registry=registry)).show(
        series(claims, instances, {0: CARD0, 1: CARD1}, users=users))
    samples = dcgm.parse(generate_latest(registry).decode(), "partkeeper_partition_info")
    return [dcgm.Sample(s.name, {**s.labels, **SCRAPE}, s.value) for s in samples]


@pytest.fixture
def exporter() -> list[dcgm.Sample]:
    """The DCGM exporter's field on the same node: the two partitions, the same GI id on both
    cards (ids repeat across cards), and a partition no Pod of ours holds (carved by hand)."""
    text = dcgm.render([dcgm.MigDevice(0, CARD0, MODEL, 9, "1g.10gb"),
                        dcgm.MigDevice(1, CARD1, MODEL, 9, "1g.10gb"),
                        dcgm.MigDevice(1, CARD1, MODEL, 3, "1g.10gb")], FIELD, value=0.25)
    return dcgm.parse(text, FIELD)


def _evaluate(expr: str, info: list[dcgm.Sample], exporter: list[dcgm.Sample]) -> list[dcgm.Sample]:
    """The panel's join as written: its label_replace copies, its `on` and `group_left` lists."""
    for dst, src in re.findall(r'"(\w+)", "\$1", "(\w+)", "\(\.\+\)"', expr):
        info = dcgm.label_replace(info, dst, src)
    [on] = re.findall(r"on \(([^)]*)\)", expr)
    [extra] = re.findall(r"group_left \(([^)]*)\)", expr)
    assert FIELD in expr
    return dcgm.join(info, exporter, [x.strip() for x in on.split(",")],
                     [x.strip() for x in extra.split(",") if x.strip()])


def test_the_join_matches_on_the_card_uuid_and_the_gpu_instance_id() -> None:
    expr = _join_expr()
    copies = set(re.findall(r'"(\w+)", "\$1", "(\w+)", "\(\.\+\)"', expr))
    assert copies == {("UUID", "card_uuid"), ("GPU_I_ID", "gpu_instance_id")}
    [on] = re.findall(r"on \(([^)]*)\)", expr)
    assert {x.strip() for x in on.split(",")} == {"UUID", "GPU_I_ID"}
    assert 'partkeeper_partition_info{node=~"$node"}' in expr


def test_every_partition_meets_its_dcgm_series_and_names_its_pods(
        info: list[dcgm.Sample], exporter: list[dcgm.Sample]) -> None:
    joined = _evaluate(_join_expr(), info, exporter)
    rows = sorted((r.labels["card_uuid"], r.labels["pod"], r.labels["container"], r.value)
                  for r in joined)
    assert rows == [(CARD0, "train-0", "main", 0.25),
                    (CARD1, "infer-a", "server", 0.25),
                    (CARD1, "infer-b", "server", 0.25)]
    # The partition carved by hand (GI 3) has no Pod: it joins nothing; the same GI id on the
    # other card does not join across cards.
    assert all(r.labels["gpu_instance_id"] == "9" for r in joined)


def test_the_join_would_refuse_a_one_side_with_two_series_per_partition(
        info: list[dcgm.Sample], exporter: list[dcgm.Sample]) -> None:
    """Why the partition series are the many side: a shared partition has one per Pod."""
    relabelled = dcgm.label_replace(dcgm.label_replace(info, "UUID", "card_uuid"),
                                    "GPU_I_ID", "gpu_instance_id")
    with pytest.raises(ValueError, match="many-to-many"):
        dcgm.join(exporter, relabelled, ["UUID", "GPU_I_ID"])


def test_the_panel_names_only_labels_the_series_carry(
        info: list[dcgm.Sample], exporter: list[dcgm.Sample]) -> None:
    carried = {k for s in info for k in s.labels} | {k for s in exporter for k in s.labels}
    assert set(LABELS) <= carried
    for target in _panel()["targets"]:
        expr = target["expr"]
        named: set[str] = set()
        for group in re.findall(r"(?:by|on|group_left) \(([^)]*)\)", expr):
            named |= {x.strip() for x in group.split(",") if x.strip()}
        named |= {x for pair in re.findall(r'"(\w+)", "\$1", "(\w+)"', expr) for x in pair}
        named |= set(re.findall(r"\{(\w+)=~", expr))
        assert named <= carried, (named - carried, expr)
        assert {"pod", "namespace", "container", "uuid"} <= named, expr
