"""NodePrepareResources after a host reboot (docs/dra.md, "After a reboot"): kubelet prepares the
same ResourceClaim again; the claim the reboot left is re-made at the allocated device's
placement, or refused with the claim and card named when that placement is taken."""

from __future__ import annotations

import asyncio
import functools
import uuid

from partkeeper.claims import machine
from tests_support.dra import DraNode, dra_node


async def reboot(stack: DraNode) -> None:
    """What a reboot and the allocator's next start leave: no partition, the claims marked (the
    start itself: tests/claims/test_boot.py)."""
    await asyncio.to_thread(stack.driver.reboot)
    await stack.store.update(0, functools.partial(machine.after_boot,
                                                  boot_id=str(uuid.uuid4())))
    [claim] = await stack.claims()
    assert claim.rebooted


async def test_prepare_after_a_reboot_remakes_at_the_allocated_placement(
    nc, js, node, kubeconfig
) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        ref = await stack.allocated("c1", "gpu-0-mig-3g40gb-4", str(uuid.uuid4()), "p1",
                                    "3g.40gb")
        before = (await stack.prepare(ref))[ref.uid]
        assert before.error == ""
        await reboot(stack)

        first = (await stack.prepare(ref))[ref.uid]
        again = (await stack.prepare(ref))[ref.uid]

        assert first.error == "" and first == before == again  # the same CDI id
        [inst] = await stack.instances()
        assert (inst.profile, inst.start) == ("3g.40gb", 4)
        [claim] = await stack.claims()
        assert (claim.state, claim.rebooted, claim.remakes) == ("active", False, 1)
        assert claim.instance is not None and claim.instance.uuid == inst.uuid


async def test_prepare_after_a_reboot_refuses_a_taken_placement_and_changes_nothing(
    nc, js, node, kubeconfig
) -> None:
    async with dra_node(nc, node, kubeconfig) as stack:
        ref = await stack.allocated("c1", "gpu-0-mig-3g40gb-4", str(uuid.uuid4()), "p1",
                                    "3g.40gb")
        assert (await stack.prepare(ref))[ref.uid].error == ""
        await reboot(stack)
        carved = await asyncio.to_thread(stack.driver.carve, 0, "1g.10gb", 5)
        [kept] = await stack.claims()

        answer = (await stack.prepare(ref))[ref.uid]

        assert "card 0 has no free placement" in answer.error and not answer.devices
        assert [c for c in await stack.claims()] == [kept]  # still rebooted, for the retry
        assert [i.uuid for i in await stack.instances()] == [carved.uuid]
