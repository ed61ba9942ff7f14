"""The whole stack as processes for a reliability scenario, and the one convergence check.

`scene()` opens a rig (nats-server(s), simulated cluster, four services: tests_support.rig),
a `Workload` making Pods through the real Kubernetes client, and a `Sentinel` watching for a
partition destroyed under a live Pod for the whole scenario. `Scene.check_converged()` is the
end of every scenario: the convergence check of tests_support.converge, with a deadline, and no
violation seen by the sentinel.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper_sim.stack.launch import SERVICES
from partkeeper_sim.stack.natsserver import EmbeddedUsers, NatsServer
from partkeeper_sim.stack.observe import PodTrack
from partkeeper_sim.stack.processes import tail
from schemas.names import BUCKET_CLAIMS
from tests_support.churn import Churn, Sentinel, Workload
from tests_support.converge import Reader, Snapshot, converged
from tests_support.rig import Rig, open_rig

# The reclaimer waits 60 s (its create timeout) before it resolves a claim the allocator left
# `creating` without an instance (docs/protocol.md); every deadline that may include it says so.
CREATE_TIMEOUT = 60.0
CONVERGE_SECONDS = 45.0
CONVERGE_AFTER_CREATE_TIMEOUT = CREATE_TIMEOUT + 45.0
FAULT_EXIT = 86


@dataclass
class Scene:
    rig: Rig
    work: Workload
    sentinel: Sentinel
    reader: Reader
    churns: list[Churn] = field(default_factory=list)

    def churn(self, profiles: Sequence[str | None], *, seed: int, slots: int = 3) -> Churn:
        """Pods cycling until `Churn.stop()` (or the end of the scene)."""
        churn = Churn(self.work, profiles, slots=slots, seed=seed)
        self.churns.append(churn)
        churn.start()
        return churn

    async def admit(self, profile: str | None, prefix: str = "pod") -> PodTrack:
        """A Pod that must be admitted (Running)."""
        pod = await self.work.admit(profile, prefix)
        assert not pod.refused, f"{pod.name} was refused: {pod.refused}\n{self.logs()}"
        return pod

    def is_ours(self, resource: str) -> bool:
        config = self.rig.stack.config
        return resource.startswith(config.resource_prefix) or resource == config.sliced_resource

    async def check_converged(self, deadline: float = CONVERGE_SECONDS) -> Snapshot:
        """The convergence check (converge.problems finds nothing within `deadline`), and
        nothing destroyed under a live Pod all along."""
        snap = await converged(self.reader.snapshot, deadline=deadline, resources=self.is_ours,
                               context=self.logs)
        await self.sentinel.check()
        assert not self.sentinel.violations, (
            f"destroyed under a live Pod: {list(self.sentinel.violations.values())}")
        assert self.sentinel.checks > 0
        return snap

    def all_alive(self) -> None:
        """Every service still runs its first process (none ended, none was restarted)."""
        rig = self.rig
        dead = [f"{n}: status {rig.child(n).status}" for n in SERVICES if not rig.alive(n)]
        assert not dead, f"{dead}\n{self.logs()}"

    def admission_errors(self) -> list[str]:
        """Pods refused at Allocate (kubelet's UnexpectedAdmissionError), as opposed to kubelet
        finding no free token at admission."""
        return [r for r in self.work.tally.refusals if "UnexpectedAdmission" in r]

    def logs(self, names: Sequence[str] = SERVICES, lines: int = 12) -> str:
        return "\n".join(f"--- {name}.log (in {self.rig.layout.root}):\n"
                         f"{tail(self.rig.layout.log(name), lines)}" for name in names)


@contextlib.asynccontextmanager
async def scene(
    *,
    servers: Sequence[NatsServer] | None = None,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    credentials: tuple[str, str] | None = None,
    users: EmbeddedUsers | None = None,
) -> AsyncIterator[Scene]:
    async with open_rig(servers=servers, overrides=overrides, credentials=credentials,
                        users=users) as rig:
        stack = rig.stack
        work = Workload(stack)
        await work.start()
        sentinel = Sentinel(work)
        store = ClaimsStore(await Bucket.open(stack.nc.jetstream(), BUCKET_CLAIMS), stack.node)
        reader = Reader(work.kube.api, store, stack.layout.cluster.sim_state,
                        stack.layout.pods_dir, stack.node)
        sentinel.start()
        sc = Scene(rig, work, sentinel, reader)
        try:
            yield sc
        finally:
            for churn in sc.churns:
                await churn.stop()
            await sentinel.stop()
            await work.stop()


# -- churn steps the kill/restart scenarios share --------------------------------------------

CHURN_PROFILES = ("1g.10gb", "2g.20gb", None)
CYCLES_BEFORE = 4
ADMITTED_AFTER = 3
PROGRESS_SECONDS = 90.0


async def admitted_more(sc: Scene, churn: Churn, more: int, timeout: float) -> None:
    """Churn goes on until `more` further Pods were admitted (the node works again)."""
    target = sc.work.tally.admitted + more
    end = time.monotonic() + timeout
    while sc.work.tally.admitted < target:
        remaining = end - time.monotonic()
        assert remaining > 0, (f"only {sc.work.tally.admitted - target + more} of {more} Pods "
                               f"admitted in {timeout:.0f}s after the restart; refusals "
                               f"{sc.work.tally.refusals[-5:]}\n{sc.logs()}")
        await churn.until_cycles(churn.cycles + 1, remaining)


async def churning(sc: Scene, seed: int) -> Churn:
    await sc.admit("3g.40gb", "keep")
    churn = sc.churn(CHURN_PROFILES, seed=seed)
    await churn.until_cycles(CYCLES_BEFORE, PROGRESS_SECONDS)
    return churn


async def settle(sc: Scene, churn: Churn) -> None:
    await churn.stop()
    await sc.check_converged(CONVERGE_AFTER_CREATE_TIMEOUT)  # a kill may leave a `creating`
    await sc.work.delete_all()
    await sc.check_converged()
