"""What only the sim driver has: a shared state file, latencies, injected failures, its UUIDs."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from partkeeper.drivers import base, profiles
from partkeeper.drivers.base import Instance, InstanceSpec
from partkeeper_sim.driver import SimDriver, card_uuid, init_state, mig_uuid
from partkeeper_sim.driver_state import LockTimeout, StateLock
from tests_support.gate import Gate

DEADLINE = 30.0  # seconds; a bound on waiting, never an expectation of how long anything takes
WORKER = Path(__file__).with_name("sim_worker.py")


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _no_overlaps(instances: list[Instance]) -> bool:
    return not any(
        profiles.overlaps(a.placement, b.placement)
        for i, a in enumerate(instances)
        for b in instances[i + 1 :]
    )


def test_processes_creating_concurrently_never_overlap(sim_path: Path) -> None:
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(sim_path), str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for seed in range(4)
    ]  # fmt: skip
    outputs = []
    for worker in workers:  # all are started before any is told to go
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        outputs.append(json.loads(out))
    made = [Instance(**d) for out in outputs for d in out]
    driver = SimDriver(sim_path)
    listed = [i for card in range(3) for i in driver.instances(card)]
    # No lost update (everything a process was granted exists) and nothing granted twice.
    assert sorted(i.uuid for i in made) == sorted(i.uuid for i in listed)
    for card in range(3):
        on_card = [i for i in listed if i.card == card]
        assert on_card and _no_overlaps(on_card)
        assert len({i.gi_id for i in on_card}) == len(on_card)


def test_threads_of_one_process_exclude_each_other(sim_path: Path) -> None:
    driver = SimDriver(sim_path)

    def grab(start: int) -> Instance | None:
        try:
            return driver.create(InstanceSpec(0, "1g.20gb", start))
        except base.PlacementError:
            return None

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(grab, [0, 2, 4, 6] * 4))
    granted = [r for r in results if r is not None]
    assert len(granted) == 4
    assert driver.instances(0) == sorted(granted, key=lambda i: i.start)


def test_destroy_latency_keeps_the_instance_listed_until_done(sim_path: Path) -> None:
    control = SimDriver(sim_path)
    inst = control.create(InstanceSpec(0, "1g.10gb", 0))
    control.latency("destroy", 250)
    gate = Gate()
    thread, errors = _in_thread(lambda: SimDriver(sim_path, sleep=gate.sleep).destroy(inst))
    assert gate.entered.wait(DEADLINE)
    # Mid-destroy: listed, its slot still taken, and the lock free for everyone else.
    assert control.instances(0) == [inst]
    assert control.list()["cards"][0]["instances"][0]["state"] == "destroying"
    with pytest.raises(base.PlacementError):
        control.create(InstanceSpec(0, "1g.10gb", 0))
    neighbour = control.create(InstanceSpec(0, "1g.10gb", 1))
    gate.release.set()
    thread.join(DEADLINE)
    assert not thread.is_alive() and errors == []
    assert control.instances(0) == [neighbour]
    assert gate.delays == [0.25]


def test_of_two_racing_slow_destroys_the_second_to_finish_finds_it_gone(sim_path: Path) -> None:
    """Both destroys pass the identity check while the instance is listed as destroying; the
    one finishing first removes it, the other is told it is gone (not a silent success)."""
    control = SimDriver(sim_path)
    inst = control.create(InstanceSpec(0, "1g.10gb", 0))
    control.latency("destroy", 250)
    gates = Gate(), Gate()
    runs = [_in_thread(partial(SimDriver(sim_path, sleep=g.sleep).destroy, inst)) for g in gates]
    assert all(g.entered.wait(DEADLINE) for g in gates)
    for gate, (thread, _) in zip(gates, runs, strict=True):
        gate.release.set()
        thread.join(DEADLINE)
        assert not thread.is_alive()
    (_, first), (_, second) = runs
    assert first == [] and [type(e) for e in second] == [base.NotFoundError]
    assert control.instances(0) == []


def test_create_latency_is_spent_outside_the_lock(sim_path: Path) -> None:
    control = SimDriver(sim_path)
    control.latency("create", 1500)
    gate = Gate()
    slow = SimDriver(sim_path, sleep=gate.sleep)
    thread, errors = _in_thread(lambda: slow.create(InstanceSpec(0, "3g.40gb", 4)))
    assert gate.entered.wait(DEADLINE)
    assert control.instances(0) == []  # not there before the create returns
    control.carve(0, "1g.10gb", 0)  # other writers are not blocked meanwhile
    gate.release.set()
    thread.join(DEADLINE)
    assert not thread.is_alive() and errors == []
    assert [i.profile for i in control.instances(0)] == ["1g.10gb", "3g.40gb"]
    assert gate.delays == [1.5]
    control.latency("create", 0)
    control.create(InstanceSpec(0, "1g.10gb", 1))
    assert gate.delays == [1.5]  # 0 turns latency off


def test_injected_failures_count_down(sim_path: Path) -> None:
    driver = SimDriver(sim_path)
    driver.fail("create", 2)
    for left in (1, 0):
        with pytest.raises(base.UnknownError, match=f"{left} more to come"):
            driver.create(InstanceSpec(0, "1g.10gb", 0))
        assert driver.list()["faults"]["create"]["times"] == left
    inst = driver.create(InstanceSpec(0, "1g.10gb", 0))

    driver.fail("destroy", 1, "in_use")
    with pytest.raises(base.InUseError) as err:
        driver.destroy(inst)
    assert "card 0" in str(err.value) and inst.uuid in str(err.value)
    driver.destroy(inst)

    driver.fail("list", 1)
    driver.list()  # the control view never consumes a failure
    with pytest.raises(base.ReadError):
        driver.instances(0)
    assert driver.instances(0) == []

    driver.fail("create", 5)
    driver.fail("create", 0)  # clears
    driver.create(InstanceSpec(0, "1g.10gb", 0))


@pytest.mark.parametrize(
    ("op", "times", "error"),
    [("reboot", 1, "unknown"), ("create", -1, "unknown"), ("create", 1, "melted")],
)
def test_bad_fault_requests_are_refused(sim_path: Path, op: str, times: int, error: str) -> None:
    before = sim_path.read_bytes()
    with pytest.raises(ValueError):
        SimDriver(sim_path).fail(op, times, error)  # type: ignore[arg-type]  # invalid arguments on purpose
    with pytest.raises(ValueError):
        SimDriver(sim_path).latency("list", 5)  # type: ignore[arg-type]  # invalid arguments on purpose
    assert sim_path.read_bytes() == before


def test_busy_flag_and_unknown_uuid(sim_path: Path) -> None:
    driver = SimDriver(sim_path)
    inst = driver.carve(0, "2g.20gb")
    assert driver.set_busy(inst.uuid, True) == inst
    assert driver.is_busy(inst)
    with pytest.raises(base.NotFoundError, match="no instance has this UUID"):
        driver.set_busy("MIG-nope", True)


def test_carve_is_foreign_and_defaults_to_the_lowest_free_start(sim_path: Path) -> None:
    driver = SimDriver(sim_path)
    assert driver.carve(0, "1g.20gb").start == 0
    assert driver.carve(0, "1g.20gb").start == 2
    view = driver.list()["cards"][0]["instances"]
    assert [i["carved"] for i in view] == [True, True]
    assert driver.create(InstanceSpec(0, "1g.20gb", 4)).start == 4
    assert [i["carved"] for i in driver.list()["cards"][0]["instances"]] == [True, True, False]


def test_uuids_are_name_based(sim_path: Path, tmp_path: Path) -> None:
    driver = SimDriver(sim_path)
    card = driver.cards()[0]
    assert card.uuid == card_uuid("", 0, "H100-80GB")
    inst = driver.create(InstanceSpec(0, "3g.40gb", 4))
    assert inst.uuid == mig_uuid(card.uuid, inst.gi_id, 0, "3g.40gb", 4)
    other = tmp_path / "other-node.json"
    init_state(other, ["H100-80GB"], [], seed="node-b")
    assert SimDriver(other).cards()[0].uuid != card.uuid


def test_a_halfway_failure_leaves_a_gpu_instance_without_compute_instance(sim_path: Path) -> None:
    """Each two-step operation stopped between its steps, as NVML and its kin can be: the sim
    shows what is left, and the next operation (the driver's retry) finishes it."""
    driver = SimDriver(sim_path)
    inst = driver.create(InstanceSpec(0, "3g.40gb", 4))
    driver.fail("destroy", 1, "halfway")
    with pytest.raises(base.UnknownError, match="compute instance was destroyed"):
        driver.destroy(inst)
    [left] = driver.instances(0)
    assert (left.gi_id, left.ci_id, left.uuid, left.start) == (inst.gi_id, -1, "", 4)
    assert [i["ci_id"] for i in driver.list()["cards"][0]["instances"]] == [-1]
    with pytest.raises(base.PlacementError):  # the slot is still held
        driver.create(InstanceSpec(0, "1g.10gb", 4))
    driver.destroy(inst)  # the recorded identity finishes it
    assert driver.instances(0) == []

    driver.fail("create", 1, "halfway")
    with pytest.raises(base.UnknownError, match="undoing it failed too"):
        driver.create(InstanceSpec(0, "2g.20gb", 2))
    [left] = driver.instances(0)
    assert not left.complete
    done = driver.create(InstanceSpec(0, "2g.20gb", 2))  # the retry completes the same GI
    assert (done.gi_id, done.complete) == (left.gi_id, True)
    assert driver.instances(0) == [done]


def test_a_halfway_failure_of_a_busy_destroy_is_in_use_and_changes_nothing(sim_path: Path) -> None:
    driver = SimDriver(sim_path)
    inst = driver.create(InstanceSpec(0, "1g.10gb", 0))
    driver.set_busy(inst.uuid, True)
    driver.fail("destroy", 1, "halfway")
    with pytest.raises(base.InUseError):
        driver.destroy(inst)
    assert driver.instances(0) == [inst]


def test_only_two_step_operations_stop_halfway(sim_path: Path) -> None:
    driver = SimDriver(sim_path)
    before = sim_path.read_bytes()
    with pytest.raises(ValueError, match="only create and destroy have two steps"):
        driver.fail("list", 1, "halfway")
    assert sim_path.read_bytes() == before


def _corrupt_variants(raw: dict[str, Any]) -> dict[str, bytes]:
    def edited(change: Callable[[dict[str, Any]], None]) -> bytes:
        data = json.loads(json.dumps(raw))
        change(data)
        return json.dumps(data).encode()

    inst = {"gi_id": 1, "ci_id": 0, "uuid": "MIG-a", "profile": "2g.20gb", "start": 0, "size": 2}
    clash = {**inst, "gi_id": 2, "uuid": "MIG-b", "profile": "1g.10gb", "start": 1, "size": 1}
    return {
        "truncated": json.dumps(raw).encode()[:40],
        "not json": b"hello\n",
        "empty": b"",
        "version": edited(lambda d: d.update(version=9)),
        "model": edited(lambda d: d["cards"][0].update(model="X100-1GB")),
        "overlap": edited(lambda d: d["cards"][0].update(instances=[inst, clash])),
        "unknown key": edited(lambda d: d.update(surprise=True)),
        "negative fault": edited(lambda d: d.update(faults={"create": {"times": -1}})),
        "illegal start": edited(lambda d: d["cards"][0].update(instances=[{**inst, "start": 1}])),
        "uuid, no ci": edited(lambda d: d["cards"][0].update(instances=[{**inst, "ci_id": -1}])),
        "ci, no uuid": edited(lambda d: d["cards"][0].update(instances=[{**inst, "uuid": ""}])),
        "fault error": edited(lambda d: d.update(faults={"list": {"times": 1, "error": "x"}})),
    }


def _every_operation(driver: SimDriver) -> list[Callable[[], Any]]:
    inst = Instance(0, "1g.10gb", 0, 1, 1, 0, "MIG-x")
    return [
        driver.cards,
        lambda: driver.instances(0),
        lambda: driver.create(InstanceSpec(0, "1g.10gb", 0)),
        lambda: driver.destroy(inst),
        lambda: driver.is_busy(inst),
        lambda: driver.carve(0, "1g.10gb"),
        lambda: driver.set_busy("MIG-x", True),
        lambda: driver.fail("create", 1),
        lambda: driver.latency("create", 1),
        driver.list,
    ]


def test_a_corrupt_state_file_is_a_read_error_and_stays_as_it_is(sim_path: Path) -> None:
    for name, content in _corrupt_variants(json.loads(sim_path.read_bytes())).items():
        sim_path.write_bytes(content)
        for operation in _every_operation(SimDriver(sim_path)):
            with pytest.raises(base.ReadError) as err:
                operation()
            assert str(sim_path) in str(err.value) and "corrupt" in str(err.value), name
            assert sim_path.read_bytes() == content, name


def test_a_missing_state_file_is_a_read_error_and_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "absent.json"
    for operation in _every_operation(SimDriver(path)):
        with pytest.raises(base.ReadError) as err:
            operation()
        assert str(path) in str(err.value) and "does not exist" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_init_refuses_to_overwrite_unless_forced(sim_path: Path) -> None:
    SimDriver(sim_path).carve(0, "7g.80gb")
    before = sim_path.read_bytes()
    with pytest.raises(FileExistsError, match=str(sim_path)):
        init_state(sim_path, ["A100-40GB"], [])
    assert sim_path.read_bytes() == before
    with pytest.raises(ValueError, match="unknown card model 'Z9'"):
        init_state(sim_path, ["Z9"], [], force=True)
    assert sim_path.read_bytes() == before
    init_state(sim_path, ["A100-40GB"], [], force=True)
    assert [c.model for c in SimDriver(sim_path).cards()] == ["A100-40GB"]
    assert SimDriver(sim_path).instances(0) == []


def test_writes_leave_only_the_state_and_its_lock(sim_path: Path) -> None:
    driver = SimDriver(sim_path)
    inst = driver.create(InstanceSpec(1, "3g.20gb", 0))
    driver.set_busy(inst.uuid, True)
    driver.set_busy(inst.uuid, False)
    driver.destroy(inst)
    assert sorted(p.name for p in sim_path.parent.iterdir()) == ["sim.json", "sim.json.lock"]
    assert sim_path.stat().st_mode & 0o777 == 0o644  # readable by every process sharing it


def test_the_state_lock_excludes_threads_and_processes_and_times_out(sim_path: Path) -> None:
    """flock(2) on an open file description of its own per lock: a second lock in this process
    or in another waits; one held past the timeout is an UnknownError naming the state file."""
    held = StateLock(sim_path)
    held.acquire()
    try:
        with pytest.raises(LockTimeout):
            StateLock(sim_path, timeout=0.05).acquire()
        other = subprocess.run(
            [sys.executable, "-c", "import sys, fcntl, os; fd = os.open(sys.argv[1], os.O_RDONLY);"
             " fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", f"{sim_path}.lock"],
            capture_output=True, text=True, check=False)
        assert other.returncode != 0 and "BlockingIOError" in other.stderr
        with pytest.raises(base.UnknownError, match=r"stayed locked for 0\.05 s"):
            SimDriver(sim_path, lock_timeout=0.05).instances(0)
    finally:
        held.release()
    assert SimDriver(sim_path).instances(0) == []  # released: the next transaction goes through
    with pytest.raises(ZeroDivisionError), StateLock(sim_path):
        raise ZeroDivisionError
    StateLock(sim_path, timeout=0.05).acquire()  # the failed transaction left it free
