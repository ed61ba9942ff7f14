"""The metrics partkeeper declares follow Prometheus naming, and docs/observability.md lists each
one with its type: a metric added without its row, or a row left for a removed metric, fails."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import REGISTRY

from partkeeper.telemetry import metrics

UNITS = ("_seconds", "_devices", "_instances", "_messages", "_connections")
DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"
ROW = re.compile(r"^\| `(partkeeper_[a-z_]+)` \| (counter|gauge|histogram)\b", re.M)


def _declared() -> dict[str, str]:
    """Exposed name -> type, for every partkeeper metric in the registry."""
    assert metrics.ALLOCATIONS  # the module declares them on import
    found: dict[str, str] = {}
    for family in REGISTRY.collect():
        if not family.name.startswith("partkeeper_"):
            continue
        name = family.name + "_total" if family.type == "counter" else family.name
        found[name] = family.type
    return found


def test_names_carry_their_unit_and_counters_end_in_total() -> None:
    declared = _declared()
    assert declared, "no partkeeper metric is registered"
    for name, kind in declared.items():
        if name.endswith("_info"):  # always 1, the labels carry the facts (build, limiter)
            continue
        if kind == "counter":
            assert name.endswith("_total"), name
        else:
            assert name.endswith(UNITS), f"{name} names no unit ({', '.join(UNITS)})"


def test_the_documented_table_is_the_declared_set() -> None:
    documented = dict(ROW.findall(DOC.read_text()))
    assert documented == _declared()
