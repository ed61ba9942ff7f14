"""NVML's card events through the real nvidia-ml-py over the fake libnvidia-ml.so.1: critical
XIDs (on a card and on one MIG instance), ECC errors, a card falling off the bus and coming back.
"""

from __future__ import annotations

import pytest
from fakes import nvml as nv
from fakes.nvml import FakeNvml

from partkeeper.drivers.base import CardLostError, InstanceSpec
from partkeeper.drivers.cardhealth import (
    NO_INSTANCE,
    CardEvent,
    EventKind,
    EventSource,
    Scope,
    classify,
    policy,
)
from partkeeper.drivers.nvidia.binding import NvmlDriver

H100, A100, H200, T4ISH = 0, 1, 2, 3
WAIT = 2.0  # seconds: an upper bound for an event already raised, never reached when it is


def _source(driver: NvmlDriver) -> EventSource:
    source = driver.events()
    assert source is not None
    return source


def test_critical_xid_names_the_card(no_complaints: FakeNvml) -> None:
    driver = NvmlDriver()
    source = _source(driver)
    no_complaints.raise_event(H200, nv.EVENT_XID, 79)
    [event] = source.wait(WAIT)
    assert (event.card, event.kind, event.xid, event.instance) == (H200, EventKind.XID, 79, None)
    assert classify(event, policy()).scope is Scope.CARD
    source.close()
    driver.close()


def test_an_instance_xid_names_its_gpu_and_compute_instance(no_complaints: FakeNvml) -> None:
    driver = NvmlDriver()
    source = _source(driver)
    no_complaints.raise_event(H100, nv.EVENT_XID, 94, gi=3, ci=0)
    [event] = source.wait(WAIT)
    assert (event.card, event.xid, event.instance) == (H100, 94, (3, 0))
    fault = classify(event, policy())
    assert (fault.scope, fault.instance) == (Scope.INSTANCE, (3, 0))
    source.close()
    driver.close()


def test_ecc_events_and_application_xids(no_complaints: FakeNvml) -> None:
    driver = NvmlDriver()
    source = _source(driver)
    no_complaints.raise_event(A100, nv.EVENT_DOUBLE_BIT_ECC)
    no_complaints.raise_event(A100, nv.EVENT_SINGLE_BIT_ECC)
    no_complaints.raise_event(A100, nv.EVENT_XID, 13)
    events = [*source.wait(WAIT), *source.wait(WAIT), *source.wait(WAIT)]
    kinds = [e.kind for e in events]
    assert kinds == [EventKind.ECC_UNCORRECTABLE, EventKind.ECC_CORRECTABLE, EventKind.XID]
    scopes = [classify(e, policy()).scope for e in events]
    assert scopes == [Scope.CARD, Scope.NONE, Scope.NONE]
    source.close()
    driver.close()


def test_events_before_the_set_was_made_are_not_delivered(no_complaints: FakeNvml) -> None:
    no_complaints.raise_event(H100, nv.EVENT_XID, 79)
    driver = NvmlDriver()
    source = _source(driver)
    assert source.wait(0.05) == []
    source.close()
    driver.close()


def test_a_lost_card_is_named_and_the_others_keep_reporting(no_complaints: FakeNvml) -> None:
    driver = NvmlDriver()
    source = _source(driver)
    no_complaints.set_lost(A100)
    [lost] = source.wait(WAIT)
    assert (lost.card, lost.kind) == (A100, EventKind.LOST)
    assert "GPU is lost" in lost.detail
    # The lost card is out of the set, so a wait no longer answers GPU_IS_LOST at once.
    assert source.wait(0.05) == []
    no_complaints.raise_event(H100, nv.EVENT_XID, 48)
    [xid] = source.wait(WAIT)
    assert (xid.card, xid.xid) == (H100, 48)
    no_complaints.set_lost(A100, False)
    [back] = source.wait(0.05)
    assert (back.card, back.kind) == (A100, EventKind.RECOVERED)
    no_complaints.raise_event(A100, nv.EVENT_XID, 79)
    [again] = source.wait(WAIT)
    assert (again.card, again.xid) == (A100, 79)
    source.close()
    driver.close()


def test_a_card_lost_before_the_set_opens_is_reported_first(no_complaints: FakeNvml) -> None:
    driver = NvmlDriver()
    no_complaints.set_lost(H200)
    source = _source(driver)
    [lost] = source.wait(0.05)
    assert (lost.card, lost.kind) == (H200, EventKind.LOST)
    source.close()
    driver.close()


def test_every_call_on_a_lost_card_says_so(no_complaints: FakeNvml) -> None:
    """What the reclaimer meets on a lost card: reads fail with NVML's GPU_IS_LOST."""
    driver = NvmlDriver()
    made = driver.create(InstanceSpec(H100, "1g.10gb", 0))
    no_complaints.set_lost(H100)
    for call in (lambda: driver.instances(H100), lambda: driver.destroy(made),
                 lambda: driver.create(InstanceSpec(H100, "1g.10gb", 1))):
        with pytest.raises(CardLostError, match="GPU is lost"):
            call()
    assert driver.instances(A100) == []
    listed = driver.cards()
    assert listed[H100].problem.startswith("lost: ") and listed[A100].problem == ""
    no_complaints.set_lost(H100, False)
    assert [i.uuid for i in driver.instances(H100)] == [made.uuid]
    driver.close()


def test_registering_a_mig_device_handle_is_not_supported(no_complaints: FakeNvml) -> None:
    """nvml.h: per-instance registration with MIG device handles is not supported; the fake
    refuses it as NVML does, so a driver that tried would see it here."""
    import pynvml

    pynvml.nvmlInit()
    dev = pynvml.nvmlDeviceGetHandleByIndex(H100)
    assert pynvml.nvmlDeviceGetSupportedEventTypes(dev) & nv.EVENT_XID
    event_set = pynvml.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError) as refused:
        pynvml.nvmlDeviceRegisterEvents(dev, 1 << 40, event_set)
    assert refused.value.value == nv.ERROR_NOT_SUPPORTED
    pynvml.nvmlEventSetFree(event_set)
    pynvml.nvmlShutdown()


def test_no_instance_is_nvmls_all_ones() -> None:
    assert CardEvent(0, EventKind.XID, 79).instance is None
    assert NO_INSTANCE == nv.NO_INSTANCE
