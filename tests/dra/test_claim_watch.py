"""The ResourceClaim watch wakes the claim lifetimes at a change of a claim they hold, and at
nothing else (services/allocator/dra/claimwatch.py): the release of a deleted or deallocated
claim's partition no longer waits for a poll (issue 27, DRA re-publish)."""

from __future__ import annotations

import asyncio
import dataclasses

from kubernetes import client
from kubernetes import config as kube_config

from partkeeper.config import Config
from partkeeper.listwatch import Event, Listed
from services.allocator.dra.claimwatch import ClaimWatch, concerns
from services.allocator.dra.kube import ResourceApi
from tests_support import until
from tests_support.dra import NAMESPACE, claim_body


def _event(kind: str, uid: str) -> Event:
    return Event({"type": kind, "object": {"metadata": {"uid": uid}}}, 0.0)


def test_only_a_held_claims_change_and_a_list_concern_the_lifetimes() -> None:
    held = {"u1"}
    assert concerns(Listed("7", []), held)  # what happened unwatched is unknown
    assert concerns(_event("MODIFIED", "u1"), held)
    assert concerns(_event("DELETED", "u1"), held)
    assert not concerns(_event("ADDED", "u1"), held)  # a claim's start ends nothing
    assert not concerns(_event("MODIFIED", "u2"), held)
    assert not concerns(_event("BOOKMARK", "u1"), held)
    assert not concerns(Event(None, 0.0), held)


async def test_a_held_claims_deletion_wakes_and_an_unrelated_change_does_not(
        kubeconfig, node) -> None:
    api_client = kube_config.new_client_from_config(config_file=str(kubeconfig))
    resource = client.ResourceV1Api(api_client)
    held = await asyncio.to_thread(resource.create_namespaced_resource_claim, NAMESPACE,
                                   claim_body("held", "1g.10gb"))
    await asyncio.to_thread(resource.create_namespaced_resource_claim, NAMESPACE,
                            claim_body("other", "1g.10gb"))
    api = await ResourceApi.connect(dataclasses.replace(Config(node=node),
                                                        kubeconfig=str(kubeconfig)))
    woken: list[int] = []
    watch = ClaimWatch(api, lambda: {held.metadata.uid}, lambda: woken.append(1))
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: watch.synced and woken, "listed: one wake for the unknown past")
        # Events come in order: the unrelated change first, then the held claim's deletion.
        await asyncio.to_thread(resource.patch_namespaced_resource_claim, "other", NAMESPACE,
                                {"metadata": {"labels": {"touched": "yes"}}})
        await asyncio.to_thread(resource.delete_namespaced_resource_claim, "held", NAMESPACE)
        await until(lambda: len(woken) >= 2, "the held claim's deletion wakes the lifetimes")
        assert watch.woken == 2, "the unrelated claim's change woke nobody"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        api.close()
        api_client.close()
