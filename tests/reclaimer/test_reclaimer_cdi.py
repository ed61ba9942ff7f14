"""The reclaimer removes a partition's CDI spec after the destroy is confirmed, never before."""

from __future__ import annotations

import asyncio
from pathlib import Path

from partkeeper import cdi
from partkeeper.drivers.base import ContainerEdits
from schemas import DestroyFailed
from tests_support import until
from tests_support.reclaimer import AuditLog, Hands, new_uid


def _spec(cdi_dir: Path, claim_id: str, uuid: str) -> Path:
    return cdi.write_spec(cdi_dir, claim_id, cdi.spec_for(claim_id, uuid, ContainerEdits(), {}))


async def test_the_cdi_spec_goes_after_the_destroy_and_stays_while_it_is_refused(
    hands: Hands, audit: AuditLog, start_reclaimer, tmp_path: Path
) -> None:
    cdi_dir = tmp_path / "cdi"
    uid = new_uid()
    claim, inst = await hands.allocate(uid)
    spec = _spec(cdi_dir, claim.id, inst.uuid)
    await asyncio.to_thread(hands.driver.set_busy, inst.uuid, True)
    await start_reclaimer(cdi_dir=cdi_dir)
    seq = await hands.gone(uid)
    await audit.wait(DestroyFailed, claim_id=claim.id)
    assert spec.exists() and await hands.exists(inst)  # refused in use: the spec stays
    await asyncio.to_thread(hands.driver.set_busy, inst.uuid, False)
    await until(lambda: hands.acked(seq), "the event is acknowledged once destroyed")
    assert not await hands.exists(inst) and await hands.claim(claim) is None
    assert not spec.exists()
    assert [p.name for p in cdi_dir.iterdir()] == []
