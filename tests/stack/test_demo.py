"""`partkeeper up --demo` end to end: the embedded default must run the scenario to a pass.

Run it alone with `pytest -m demo`.
"""

from __future__ import annotations

import subprocess

import pytest

from tests_support.stack import (
    DEMO_DEADLINE,
    partkeeper,
    recorded_children,
    short_workdir,
    wait_no_survivors,
)

pytestmark = [pytest.mark.demo, pytest.mark.stack, pytest.mark.timeout(DEMO_DEADLINE + 60)]


def test_up_demo_passes_and_leaves_no_process() -> None:
    with short_workdir() as workdir:
        done = subprocess.run(
            partkeeper("up", "--demo", "--workdir", str(workdir)), capture_output=True,
            text=True, timeout=DEMO_DEADLINE, check=False,
        )
        report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        assert done.returncode == 0, report
        # Not a terminal: the plain, CI-readable summary.
        assert "partkeeper demo summary" in done.stdout, report
        assert "refused 0" in done.stdout, report
        assert "leaks: none" in done.stdout, report
        assert "result: PASS" in done.stdout, report
        # The embedded stack runs without a slice limiter and says so in the summary.
        assert "slices NOT enforced: no slice limiter" in done.stdout, report
        children = recorded_children(workdir)
        assert set(children) == {"nats", "cluster", "watcher", "allocator", "reclaimer", "gc"}
        assert not wait_no_survivors([c["process_group"] for c in children.values()])
