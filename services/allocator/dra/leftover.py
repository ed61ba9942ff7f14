"""Device-plugin mode on a node that still holds DRA claims: a node moved back from DRA while
its Pods ran (docs/operations.md, "Moving it back").

The partitions of DRA claims belong to their ResourceClaims, not to Pods, so the reclaimer never
releases them on a Pod's end (services/reclaimer/decide.py); in DRA mode `ends.ClaimEnds` does,
once a ResourceClaim is deleted or deallocated. Without it the way back leaked: the partitions
were kept, correctly, while used, and then never destroyed. So while any DRA claim is in the
store, the device-plugin allocator also runs, from DRA mode:

- the claim lifetimes (`ClaimEnds`, woken by the ResourceClaim watch), which release a claim
  once its ResourceClaim's use has ended and ask the reclaimer to destroy it at once;
- the kubelet plugin, for `NodeUnprepareResources` only: kubelet unprepares a Pod's claims
  after its containers stop and before it reports the Pod terminated, and retries until the
  driver answers (pkg/kubelet/kubelet.go, `SyncTerminatingPod`: "resources must be unprepared
  AFTER all containers have stopped and BEFORE the pod status is changed on the API server"),
  so without a plugin the Pods of DRA claims would stay Terminating for ever.
  `NodePrepareResources` is refused: this node offers no DRA devices now;
- its ResourceSlices are withdrawn once, so the scheduler allocates nothing more here (the
  kubelet would wipe them too, but only after the plugin is unusable for 30 s, and the plugin
  stays usable here).

The DRA claims count as occupied in the device plugin's tokens meanwhile (capacity is claims
union instances, whatever wrote the claim), so the device plugin advertises only the remaining
room. Once the store holds no DRA claim, the plugin stops and the API client is closed; a node
that never ran DRA mode reads the claims once and does nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from partkeeper import backoff
from partkeeper.claims import StoreReadError
from partkeeper.kubelet import dra_pb2 as pb
from partkeeper.lifecycle import cancel_all, woken_or_timeout
from services.allocator.core.state import Context
from services.allocator.dra.claimwatch import ClaimWatch
from services.allocator.dra.ends import ClaimEnds
from services.allocator.dra.kube import KubeError, ResourceApi
from services.allocator.dra.plugin import KubeletPlugin
from services.allocator.dra.prepare import Preparer

log = logging.getLogger(__name__)

REFUSED = ("this node's allocator runs in device-plugin mode (PK_MODE=deviceplugin): it "
           "prepares no ResourceClaim, and serves DRA only to unprepare the claims prepared "
           "before it moved back")
# How often the store is read again for DRA claims while some remain, besides every change.
RECHECK_SECONDS = 5.0


class UnprepareOnly(Preparer):
    """Kubelet's unprepare calls as in DRA mode; prepare refused with a sentence."""

    async def prepare(self, ref: pb.Claim) -> pb.NodePrepareResourceResponse:
        log.warning("NodePrepareResources of %s/%s refused: %s", ref.namespace, ref.name, REFUSED)
        return pb.NodePrepareResourceResponse(error=REFUSED)


async def dra_claims(ctx: Context) -> int:
    """How many claims of the store DRA mode wrote (they name a ResourceClaim)."""
    docs = await ctx.store.read_all([c.index for c in ctx.cards])
    return sum(1 for doc, _ in docs.values() for c in doc.claims.values()
               if c.resource_claim_uid)


async def _count(ctx: Context) -> int:
    """`dra_claims`, read again with backoff until the store answers: a failed read is never
    taken as "none" (invariant 9)."""
    attempt = 0
    while True:
        try:
            return await dra_claims(ctx)
        except StoreReadError as exc:
            attempt += 1
            log.warning("reading the claims for DRA claims failed (%s); again soon", exc)
            await asyncio.sleep(backoff.delay(attempt, base=0.1, cap=5.0))


async def _connect(ctx: Context) -> ResourceApi:
    attempt = 0
    while True:
        try:
            return await ResourceApi.connect(ctx.config)
        except KubeError as exc:
            attempt += 1
            log.error("%d DRA claim(s) remain on node %s from DRA mode, and the API server "
                      "cannot be reached (%s): their partitions are kept and not released "
                      "until it can; the allocator needs the DRA RBAC until they are gone",
                      await dra_claims(ctx), ctx.node, exc)
            await asyncio.sleep(backoff.delay(attempt, base=1.0, cap=60.0))


async def _withdraw(api: ResourceApi) -> None:
    try:
        for obj in await api.list_slices():
            await api.delete_slice(obj["metadata"]["name"])
    except KubeError as exc:
        log.warning("withdrawing the node's ResourceSlices failed (%s); kubelet wipes them "
                    "once no DRA plugin serves", exc)


async def run(ctx: Context) -> None:
    """Serve what the DRA claims in the store need until none is left, then idle until the
    allocator stops (a task of its Lifecycle must not end on its own)."""
    if await _count(ctx):
        await _serve(ctx)
    await asyncio.Event().wait()


async def _serve(ctx: Context) -> None:
    left = await _count(ctx)
    log.info("%d DRA claim(s) on node %s from DRA mode: their ResourceClaims' ends are watched "
             "and kubelet may unprepare them; no new one is prepared", left, ctx.node)
    api = await _connect(ctx)
    tasks: list[asyncio.Task[None]] = []
    plugin: KubeletPlugin | None = None
    try:
        await _withdraw(api)
        ends = ClaimEnds(ctx, api)
        preparer = UnprepareOnly(ctx, api, ends.wake)
        config = ctx.config
        plugin = KubeletPlugin(config.kubelet_registry_dir, config.kubelet_plugins_dir, preparer)
        try:
            await plugin.start()
        except (OSError, RuntimeError) as exc:
            # The device plugins must keep serving: no crash loop over this. The claims still
            # end once their ResourceClaims are deleted, but kubelet cannot unprepare them, so
            # their Pods stay Terminating until the plugin can serve.
            log.error("the DRA kubelet plugin cannot serve on %s (%s): kubelet cannot unprepare "
                      "the %d DRA claim(s) left, and their Pods stay Terminating; mount the "
                      "kubelet's plugins and plugins_registry dirs (PK_KUBELET_PLUGINS_DIR, "
                      "PK_KUBELET_REGISTRY_DIR) until they are gone",
                      plugin.service_path, exc, left)
            await plugin.stop()  # what did start, if anything
            plugin = None
        claims = ClaimWatch(api, lambda: ends.held, ends.wake)
        ends.watched = lambda: claims.synced
        tasks = [asyncio.create_task(claims.run(), name="ResourceClaim watch"),
                 asyncio.create_task(ends.run(), name="claim lifetimes")]
        while left:
            change = ctx.changes.next_change()
            await woken_or_timeout(change, RECHECK_SECONDS)
            for task in tasks:
                if task.done():
                    task.result()  # a failure of either is the allocator's
            left = await _count(ctx)
        log.info("no DRA claim left on node %s: the DRA kubelet plugin stops", ctx.node)
    finally:
        await cancel_all(tasks)
        if plugin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                await plugin.stop()
        api.close()
