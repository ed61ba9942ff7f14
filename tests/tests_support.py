"""Small builders shared by tests."""

from __future__ import annotations

from schemas import Claim

UID = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"


def make_claim(
    cid: str, start: int, size: int, *, card: int = 0, state: str = "creating", uid: str = UID
) -> Claim:
    return Claim(
        id=cid, state=state, pod_uid=uid, namespace="default", name="pod", container="main",
        resource="nvidia.com/mig-test", device_ids=[cid], card=card, profile="test",
        start=start, size=size, created_at=0, updated_at=0,
    )


async def eventually(check, *, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Wait until `await check()` is truthy, failing after `timeout` seconds (a deadline)."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout:g}s: {check.__qualname__}")
        await asyncio.sleep(interval)
