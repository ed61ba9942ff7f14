"""A node moved between device plugins and DRA with its Pods running, on the whole stack (real
NATS, the four services as processes, the simulated API server, scheduler and both kubelet
sides): device plugin -> DRA (the migration), DRA -> device plugin (the rollback), and the
demo's verdict."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest
from rich.console import Console

from partkeeper.drivers.profiles import model
from partkeeper_sim.stack import migrate
from partkeeper_sim.stack.launch import SERVICES
from partkeeper_sim.stack.migrate import NAMESPACE, PREFIX, PROFILES, Migration, Placement
from tests_support import until
from tests_support.rig import open_rig
from tests_support.stack import DEMO_DEADLINE, partkeeper, short_workdir

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]


def quiet() -> Console:
    return Console(quiet=True)


@pytest.mark.parametrize("restarted", [("allocator",), SERVICES],
                         ids=["allocator alone", "all four services"])
async def test_a_node_moves_to_dra_with_its_pods_running(restarted: tuple[str, ...]) -> None:
    async with open_rig(mode="both") as rig:
        out = await migrate.run(rig.stack, rig.supervisor, quiet(), restarted)
        report = "\n".join(out.lines)
        assert out.adopted == len(PROFILES), report  # every old claim adopted
        assert not out.restarted, report
        assert not out.destroyed_live, report
        assert not out.overlaps, report
        assert not out.failed, report
        assert out.admitted_through_dra == 2 * len(PROFILES), report
        assert sorted(out.room_back) == sorted(f"old-{p.replace('.', '')}" for p in PROFILES)
        assert out.passed, report


def free_now(profile: str, cards: dict[int, str], held: list[Placement]) -> int:
    """How many `profile` partitions fit now beside `held`: what the device plugin may
    advertise Healthy. Greedy by start is exact for one profile."""
    total = 0
    for card, name in cards.items():
        taken = [(p.start, p.size) for p in held if p.card == card]
        for start, size in model(name).profiles[profile].placements():
            if all(start + size <= s or s + z <= start for s, z in taken):
                taken.append((start, size))
                total += 1
    return total


async def test_a_node_moves_back_to_the_device_plugin_and_dra_partitions_end_with_their_claims(
) -> None:
    async with open_rig(mode="both", overrides={"allocator": {"PK_MODE": "dra"}}) as rig:
        m = Migration(rig.stack, rig.supervisor, quiet())
        try:
            names = [f"dra-{p.replace('.', '')}" for p in PROFILES]
            await m.admit(names, None)  # unchanged specs, through DRA
            pods = await m.pods()
            started = {n: (pods[n].metadata.uid, str(pods[n].status.start_time)) for n in names}
            held = await m.partitions()
            assert len(held) == len(PROFILES)
            claims = await m.call(m.resource.list_namespaced_resource_claim, NAMESPACE)
            assert len(claims.items) == len(PROFILES)

            await rig.restart("allocator", extra={"PK_MODE": "deviceplugin"})

            expected = {f"{PREFIX}{profile}": str(free_now(profile, m.models, list(held.values())))
                        for profile in ("7g.80gb", "3g.40gb", "2g.20gb", "1g.10gb")}

            async def advertised() -> bool:
                left = await m.allocatable()
                return all(left.get(name) == count for name, count in expected.items())
            # Registration goes one resource at a time and the Node's status follows: the wait
            # is for the whole picture, and it must be exactly the room left beside the DRA
            # partitions (a leaked or ignored DRA claim would show as more).
            await until(advertised, f"the device plugin advertising exactly {expected}")
            # Nothing more is allocated here through DRA, and status marks the claims adopted.
            await until(lambda: _empty(m.offered()), "the node's ResourceSlices withdrawn")
            doc = await m.status()
            modes = [(c["mode"], c["adopted"]) for card in doc["cards"] for c in card["claims"]]
            assert modes == [("dra", True)] * len(PROFILES)
            # The DRA Pods kept running on their partitions through the switch.
            pods = await m.pods()
            for name in names:
                assert pods[name].status.phase == "Running"
                assert (pods[name].metadata.uid, str(pods[name].status.start_time)) == \
                    started[name]
            assert await m.partitions() == held

            # Unchanged specs are now served by the device plugin, in the remaining room.
            await m.admit([f"dp-{p.replace('.', '')}" for p in PROFILES], None)
            assert not await m.allocated() or set(await m.allocated()) <= set(names)

            # The DRA Pods end: kubelet unprepares through the allocator (device-plugin mode),
            # their claims are deleted, and their partitions are destroyed: nothing leaks.
            before = time.monotonic()
            for name in names:
                await m.call(m.core.delete_namespaced_pod, name, NAMESPACE)

            async def released() -> bool:
                now = await m.partitions()
                pods = await m.pods()
                return not set(held) & set(now) and not set(names) & set(pods)
            await until(released, "the DRA Pods gone and their partitions destroyed", 60)
            took = time.monotonic() - before
            claims = await m.call(m.resource.list_namespaced_resource_claim, NAMESPACE)
            assert not claims.items, "the special claims went with their Pods"

            async def room_back() -> bool:
                # Healthy tokens: those the device-plugin Pods hold, plus the room placeable now.
                left, now = await m.allocatable(), list((await m.partitions()).values())
                return all(left.get(f"{PREFIX}{p}") == str(free_now(p, m.models, now) + 1)
                           for p in PROFILES)
            await until(room_back, "the device plugin advertises the freed room again", 30)
            assert not m.out.failed, f"Pods failed: {m.out.failed}"
            assert took < 60
        finally:
            m.api_client.close()


async def _empty(listing: Any) -> bool:
    return not await listing


def test_the_migration_demo_passes_only_when_its_summary_holds() -> None:
    out = migrate.Outcome(adopted=len(PROFILES),
                          room_back={f"old-{i}": 0.1 for i in range(len(PROFILES))})
    assert migrate.holds(out)
    broken: list[dict[str, Any]] = [
        {"restarted": {"old-a"}}, {"destroyed_live": {"old-a"}}, {"failed": {"new-a"}},
        {"overlaps": ["x"]}, {"room_back": {}}, {"adopted": 0},
    ]
    for change in broken:
        bad = migrate.Outcome(**{"adopted": out.adopted, "room_back": out.room_back, **change})
        assert not migrate.holds(bad), change


@pytest.mark.demo
@pytest.mark.timeout(DEMO_DEADLINE + 60)
def test_up_demo_migrate_passes() -> None:
    with short_workdir() as workdir:
        done = subprocess.run(
            partkeeper("up", "--demo", "--migrate", "--workdir", str(workdir)),
            capture_output=True, text=True, timeout=DEMO_DEADLINE, check=False)
        report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        assert done.returncode == 0, report
        assert "Pods restarted 0, partitions destroyed under live Pods 0, over-admissions 0, " \
            "overlapping allocations 0" in done.stdout, report
        assert "PASSED" in done.stdout, report
