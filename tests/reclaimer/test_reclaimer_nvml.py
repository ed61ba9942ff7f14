"""The real reclaimer over the nvml driver and the C NVML: a destroy that stops between the
compute instance and the GPU instance is finished, and only then is the claim removed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from fakes import nvml as nv
from fakes.nvml import FakeNvml

from partkeeper.claims import machine
from partkeeper.drivers.base import Instance, InstanceSpec
from partkeeper.drivers.nvidia.binding import NvmlDriver
from schemas import Claim, ClaimChanged, DestroyFailed, LiveInstance
from services.watcher import kube_events
from tests_support import until
from tests_support.reclaimer import MODEL, AuditLog, Hands, new_uid


@pytest.fixture
def fake(nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml.create(nvml_library, tmp_path / "nvml.state")
    fake.add_gpu(MODEL)
    fake.add_gpu(MODEL)
    monkeypatch.setenv(fake.state_env, str(fake.state))
    return fake


async def _active(hands: Hands, driver: NvmlDriver) -> tuple[str, Claim, Instance]:
    """A Pod's claim, active on a partition the driver made at its placement."""
    uid = new_uid()
    claim = await hands.begin(uid, start=2)
    spec = InstanceSpec(claim.card, claim.profile, claim.start)
    inst = await asyncio.to_thread(driver.create, spec)
    live = LiveInstance(gi_id=inst.gi_id, ci_id=inst.ci_id, uuid=inst.uuid)
    await hands.store.update(claim.card, lambda d: machine.activate(d, claim.id, live, time.time()))
    return uid, claim, inst


async def test_a_half_done_destroy_is_finished_before_the_claim_goes(
    hands: Hands, audit: AuditLog, start_reclaimer, fake: FakeNvml
) -> None:
    driver = NvmlDriver()
    uid, claim, _inst = await _active(hands, driver)
    fake.fail("nvmlGpuInstanceDestroy", nv.ERROR_UNKNOWN)  # the CI goes, then the GI refuses

    await start_reclaimer(driver="nvml")
    seq = await hands.gone(uid)
    await until(lambda: hands.acked(seq), "the event is acknowledged once destroyed")
    assert await hands.claim(claim) is None
    assert await asyncio.to_thread(driver.instances, claim.card) == []  # no foreign remnant
    assert fake.calls("nvmlGpuInstanceDestroy") == 2 and fake.complaints()[0] == 0
    assert audit.of(DestroyFailed, claim_id=claim.id) == []  # one failure, below the threshold


async def test_a_destroy_meeting_mig_switched_off_is_done_and_says_why(
    hands: Hands, audit: AuditLog, start_reclaimer, fake: FakeNvml
) -> None:
    """MIG disabled under the reclaimer, between its enumeration and its destroy: NVML answers
    NOT_SUPPORTED for the GPU instance, and with MIG off none can exist. The claim goes (no
    retrying forever) and its removal, the Event's source, says why."""
    driver = NvmlDriver()
    uid, claim, inst = await _active(hands, driver)
    fake.fail("nvmlDeviceGetGpuInstanceById", nv.ERROR_NOT_SUPPORTED, times=-1)

    await start_reclaimer(driver="nvml")
    seq = await hands.gone(uid)
    await until(lambda: hands.acked(seq), "the event is acknowledged once the claim is gone")
    assert await hands.claim(claim) is None
    [removed] = audit.of(ClaimChanged, claim_id=claim.id, state="removed")
    assert "MIG mode was switched off on the card" in removed.reason
    assert f"GPU instance {inst.gi_id}" in removed.reason
    note = kube_events.describe(removed)
    assert note is not None and note.reason == "PartitionReclaimed"
    assert "so no GPU instance can exist on it" in note.message
    assert audit.of(DestroyFailed, claim_id=claim.id) == []
    assert fake.calls("nvmlGpuInstanceDestroy") == 0  # nothing left to destroy


async def test_mig_switched_off_under_an_active_claim_frees_it(
    hands: Hands, audit: AuditLog, start_reclaimer, fake: FakeNvml
) -> None:
    driver = NvmlDriver()
    uid, claim, _inst = await _active(hands, driver)
    fake.set_mig_mode(claim.card, current=False)  # every instance of the card goes with it

    await start_reclaimer(driver="nvml")
    seq = await hands.gone(uid)
    await until(lambda: hands.acked(seq), "the event is acknowledged once the claim is gone")
    assert await hands.claim(claim) is None and audit.of(DestroyFailed, claim_id=claim.id) == []
