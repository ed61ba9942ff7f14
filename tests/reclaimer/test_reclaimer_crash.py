"""A reclaimer killed between two steps converges after restart: no leaked instance, no lost claim.

The reclaimer runs as its own process (`python -m services.reclaimer`) so the fault point's exit
is a real crash; the restart runs without the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import BinaryIO

import pytest

from partkeeper.config import Config
from partkeeper.faults import EXIT_STATUS
from schemas import ClaimChanged
from tests_support import until
from tests_support.reclaimer import DEADLINE, AuditLog, FakeWatcher, Hands, new_uid

REPO = Path(__file__).resolve().parents[2]


async def spawn(config: Config, log: Path, faults: str = "") -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PK_", "OTEL_", "NATS_"))}
    env.update({
        "NATS_URL": config.nats_urls[0], "PK_NODE_NAME": config.node, "PK_DRIVER": "sim",
        "PK_SIM_STATE": str(config.sim_state), "PK_PODS_DIR": str(config.pods_dir),
        "PK_METRICS_PORT": "0", "PK_RESYNC_SECONDS": "0.3", "PK_FAULTS": faults,
    })
    with _append(log) as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.reclaimer", cwd=REPO, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=out,
        )


def _append(path: Path) -> BinaryIO:
    return path.open("ab")


async def stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), DEADLINE)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    return int(proc.returncode or 0)


@pytest.mark.parametrize("point", ["reclaimer.after_releasing", "reclaimer.after_destroy"])
async def test_a_crash_between_steps_converges_after_restart(
    point: str, hands: Hands, watcher: FakeWatcher, audit: AuditLog, config: Config,
    tmp_path: Path,
) -> None:
    uid, bystander = new_uid(), new_uid()
    watcher.states[bystander] = "live"  # the dying Pod is not in the table: only the event acts
    claim, inst = await hands.allocate(uid, card=0, start=0)
    keep, keep_inst = await hands.allocate(bystander, card=1, start=0)
    log = tmp_path / "reclaimer.log"
    await hands.gone(uid)

    first = await spawn(config, log, f"{point}=exit")
    try:
        await asyncio.wait_for(first.wait(), DEADLINE)
    finally:
        await stop(first)
    assert first.returncode == EXIT_STATUS, log.read_text()[-2000:]
    crashed = await hands.claim(claim)
    assert crashed is not None and crashed.state == "releasing"  # the intent survived the crash
    assert await hands.exists(inst) == (point == "reclaimer.after_releasing")

    second = await spawn(config, log)
    try:
        await until(lambda: hands.removed(claim), "the claim is removed after the restart")
        assert not await hands.exists(inst)
        assert not hands.descriptor(claim, inst).exists()
        await audit.wait(ClaimChanged, claim_id=claim.id, state="removed")
    finally:
        assert await stop(second) == 0, log.read_text()[-2000:]
    assert [e.state for e in audit.of(ClaimChanged, claim_id=claim.id)] == [
        "releasing", "removed"]
    assert (await hands.current(keep)).state == "active" and await hands.exists(keep_inst)
