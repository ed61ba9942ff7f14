"""The simulated cards' health through `partkeeper sim fail --card` / `sim recover` and the
event source the services read (sim/partkeeper_sim/driver_health.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from partkeeper.drivers.base import CardLostError, InstanceSpec
from partkeeper.drivers.cardhealth import EventKind, Scope, classify, policy
from partkeeper_sim.driver import SimDriver

WAIT = 2.0  # an upper bound for an event already reported, never reached when it is


def sim(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "partkeeper", "sim", *args, "--state", str(state)]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def test_a_card_xid_an_instance_xid_a_lost_card_and_recovery(sim_path: Path) -> None:
    driver = SimDriver(sim_path)
    made = driver.create(InstanceSpec(0, "1g.10gb", 0))
    source = driver.events()
    assert source is not None
    assert source.wait(0.05) == []

    assert sim(sim_path, "fail", "--card", "1", "--xid", "48").returncode == 0
    [card] = source.wait(WAIT)
    assert (card.card, card.kind, card.xid, card.instance) == (1, EventKind.XID, 48, None)
    assert classify(card, policy()).scope is Scope.CARD

    assert sim(sim_path, "fail", "--card", "0", "--xid", "94", "--instance", made.uuid
               ).returncode == 0
    [one] = source.wait(WAIT)
    assert one.instance == (made.gi_id, made.ci_id)
    assert classify(one, policy()).scope is Scope.INSTANCE

    assert sim(sim_path, "fail", "--card", "2", "--xid", "13").returncode == 0
    [app] = source.wait(WAIT)
    assert classify(app, policy()).scope is Scope.NONE

    done = sim(sim_path, "fail", "--card", "2", "--xid", "79", "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["xid"] == 79
    [lost] = source.wait(WAIT)
    assert (lost.card, lost.kind) == (2, EventKind.LOST)
    assert driver.list()["lost"] == [2]

    assert sim(sim_path, "recover", "--card", "2").returncode == 0
    [back] = source.wait(WAIT)
    assert (back.card, back.kind) == (2, EventKind.RECOVERED)
    assert driver.list()["lost"] == []


def test_bad_requests_change_nothing(sim_path: Path) -> None:
    before = sim_path.read_bytes()
    for args in (
        ("fail", "--card", "9", "--xid", "79"),
        ("fail", "--card", "0", "--xid", "79", "--instance", "MIG-nope"),
        ("fail", "--card", "0"),
        ("fail", "--card", "0", "--xid", "79", "--times", "2"),
        ("fail", "--op", "create", "--xid", "79"),
        ("recover", "--card", "7"),
    ):
        done = sim(sim_path, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
    assert sim_path.read_bytes() == before


def test_the_operation_faults_still_work(sim_path: Path) -> None:
    assert sim(sim_path, "fail", "--op", "create", "--times", "1").returncode == 0
    assert SimDriver(sim_path).list()["faults"]["create"]["times"] == 1


def test_sim_list_gives_each_cards_health(sim_path: Path) -> None:
    driver = SimDriver(sim_path)
    made = driver.create(InstanceSpec(0, "1g.10gb", 0))
    driver.fail_card(0, 94, made.uuid)
    driver.fail_card(1, 13)
    driver.fail_card(1, 48)
    driver.fail_card(2, 79)
    cards = {c["index"]: (c["health"], c["xids"]) for c in driver.list()["cards"]}
    assert cards[0] == ("ok", [94])  # one partition failed, the card keeps serving
    assert cards[1] == ("failed", [48])  # XID 13 is an application's
    assert cards[2] == ("lost", [79])
    driver.recover_card(1)
    assert driver.list()["cards"][1]["health"] == "ok"
    assert driver.list()["cards"][1]["xids"] == []


def test_every_call_on_a_lost_card_fails_as_nvml_answers(sim_path: Path) -> None:
    driver = SimDriver(sim_path)
    made = driver.create(InstanceSpec(0, "1g.10gb", 0))
    driver.fail_card(0, 79)
    for call in (lambda: driver.instances(0), lambda: driver.is_busy(made),
                 lambda: driver.destroy(made),
                 lambda: driver.create(InstanceSpec(0, "1g.10gb", 1))):
        with pytest.raises(CardLostError, match="GPU is lost"):
            call()
    assert driver.instances(1) == []  # the other cards answer
    driver.recover_card(0)
    assert driver.instances(0) == []  # a reset clears a card's partitions


def test_a_failed_card_that_answers_keeps_its_partitions_through_recovery(sim_path: Path) -> None:
    driver = SimDriver(sim_path)
    made = driver.create(InstanceSpec(0, "1g.10gb", 0))
    driver.fail_card(0, 48)
    assert [i.uuid for i in driver.instances(0)] == [made.uuid]
    driver.recover_card(0)
    assert [i.uuid for i in driver.instances(0)] == [made.uuid]


def test_a_lost_card_stays_listed_with_a_problem(sim_path: Path) -> None:
    driver = SimDriver(sim_path)
    driver.fail_card(1, 79)
    cards = driver.cards()
    assert [c.index for c in cards] == [0, 1, 2, 3]
    assert cards[1].problem == "lost: GPU is lost" and cards[1].mode == "partition"
    assert cards[0].problem == ""
