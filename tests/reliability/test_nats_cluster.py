"""A three-server NATS cluster (streams and buckets with 3 replicas) loses its JetStream meta
leader mid-churn: the services, given all three URLs, carry on through the other two, and the
node converges with nothing lost."""

from __future__ import annotations

import pytest
from reliability import rel_harness as rh
from reliability.nats_cluster import Cluster, cluster_root, remove

from partkeeper.stack.launch import SERVICES
from schemas.names import STREAM_PODS

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(480)]

REPLICAS = "3"
# Three servers, the simulated cluster and four services share two cores here: progress is bound
# by a deadline twice the single-server one (a bound, not an expectation; once 7 of 8 cycles came
# within 90 s under a concurrent load).
CLUSTER_PROGRESS_SECONDS = 2 * rh.PROGRESS_SECONDS


async def test_cluster_loses_its_leader_mid_churn() -> None:
    root = cluster_root()
    cluster = Cluster(root)
    try:
        await cluster.start()
        overrides = {name: {"PK_STREAM_REPLICAS": REPLICAS} for name in SERVICES}
        async with rh.scene(servers=cluster.servers, overrides=overrides) as sc:
            info = await sc.rig.stack.nc.jetstream().stream_info(STREAM_PODS)
            assert info.config.num_replicas == int(REPLICAS)
            churn = await churning(sc, seed=11)
            leader = await cluster.wait_leader()
            await cluster.kill(leader)
            assert await cluster.wait_leader(other_than=leader) != leader
            await admitted_more(sc, churn, ADMITTED_AFTER, CLUSTER_PROGRESS_SECONDS)
            sc.all_alive()
            assert not sc.admission_errors(), sc.admission_errors()
            await settle(sc, churn)
            sc.all_alive()
    finally:
        await cluster.stop()
        remove(root)
