"""`partkeeper up --demo --mode dra` end to end: real services, the simulated scheduler and DRA
kubelet; what fits runs, the rest waits Pending and runs once the room is freed; nothing fails."""

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


def test_up_demo_dra_passes_and_leaves_no_process() -> None:
    with short_workdir() as workdir:
        done = subprocess.run(
            partkeeper("up", "--demo", "--mode", "dra", "--workdir", str(workdir)),
            capture_output=True, text=True, timeout=DEMO_DEADLINE, check=False,
        )
        report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        assert done.returncode == 0, report
        assert "partkeeper demo summary (DRA mode)" in done.stdout, report
        assert "waited Pending 1, failed 0" in done.stdout, report
        assert "for ResourceClaim partkeeper-demo/" in done.stdout, report
        assert "shared ResourceClaim: 2 Pods on one partition" in done.stdout, report
        assert "firstAvailable allocated gpu/p0" in done.stdout, report
        assert "PASSED" in done.stdout, report
        assert not list((workdir / "cdi").glob("*.json")), "unprepare removes the CDI specs"
        children = recorded_children(workdir)
        assert set(children) == {"nats", "cluster", "watcher", "allocator", "reclaimer", "gc"}
        assert not wait_no_survivors([c["process_group"] for c in children.values()])
