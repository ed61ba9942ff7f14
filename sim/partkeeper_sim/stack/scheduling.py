"""The demo plays the Kubernetes scheduler: it binds a Pod to the node once the node has room.

The simulated kubelet has no scheduler in front of it: a Pod bound to the node is admitted
against the Healthy free devices of that moment (docs/kubelet.md). A real scheduler binds a Pod
only when the node's allocatable count shows room, so the demo does the same: it creates each Pod
unbound at once (its admission latency counts from there) and binds it when both the kubelet
(Healthy devices not assigned, pod-resources API) and the allocator (free placements in its
capacity document) show room for it. A refill created the moment its predecessor is deleted thus
waits exactly as long as the reclaim of the predecessor's partition takes, and is then admitted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import nats.errors
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from partkeeper.kubelet import open_unix_channel, podresources_pb2, podresources_pb2_grpc
from partkeeper_sim.stack.kube import Kube
from partkeeper_sim.stack.observe import DemoError, Observer, PodTrack
from partkeeper_sim.stack.readiness import allocatable_on
from schemas import NodeCapacity, decode
from schemas.names import BUCKET_CAPACITY, capacity_key

ROOM_SECONDS = 45.0  # a reclaim (destroy + capacity update) must free the room within this
ADMIT_SECONDS = 30.0  # the kubelet's admission, Allocate included


@dataclass(slots=True)
class Scheduler:
    kube: Kube
    observer: Observer
    nc: Client
    socket: Path  # the kubelet's pod-resources socket
    # The capacity bucket's handle, looked up once.
    _capacity: KeyValue | None = field(default=None, init=False)

    async def create(self, name: str, resource: str, kind: str) -> PodTrack:
        pod = self.observer.track(PodTrack(name, resource, kind, created=time.monotonic()))
        pod.uid = await self.kube.create(name, resource)
        return pod

    async def schedule(self, pod: PodTrack) -> PodTrack:
        """Bind `pod` once the node has room, then wait for the kubelet's verdict."""
        await self.observer.wakeups.until(
            lambda: self.room(pod.resource), timeout=ROOM_SECONDS,
            what=f"room for Pod {pod.name} ({pod.resource})",
            hint="a predecessor's partition was not reclaimed; see logs/reclaimer.log "
                 "and logs/allocator.log",
        )
        await self.kube.bind(pod.name)
        pod.bound = time.monotonic()

        async def settled() -> bool:
            return pod.settled

        await self.observer.wakeups.until(
            settled, timeout=ADMIT_SECONDS, what=f"admission of Pod {pod.name} ({pod.resource})",
            hint="see logs/cluster.log (kubelet) and logs/allocator.log",
        )
        return pod

    async def run(self, name: str, resource: str, kind: str) -> PodTrack:
        return await self.schedule(await self.create(name, resource, kind))

    async def delete(self, pod: PodTrack) -> None:
        pod.deleted = time.monotonic()
        await self.kube.delete(pod.name)

    async def room(self, resource: str) -> bool:
        return await self._allocator_free(resource) > 0 and await self._kubelet_free(resource) > 0

    async def _allocator_free(self, resource: str) -> int:
        """Free placements in the allocator's capacity document; 0 while it cannot be read (a
        NATS restart, a cluster electing its leaders): no room is assumed, and the next wake-up
        (a second at most) reads again."""
        try:
            if self._capacity is None:
                self._capacity = await self.nc.jetstream().key_value(BUCKET_CAPACITY)
            entry = await self._capacity.get(capacity_key(self.observer.node))
        except KeyNotFoundError:
            return 0
        except (TimeoutError, nats.errors.Error):
            self._capacity = None  # looked up again: the bucket may have been re-created
            return 0
        doc = decode(entry.value or b"", NodeCapacity, what="capacity document")
        found = doc.resources.get(resource)
        return found.free if found else 0

    async def _kubelet_free(self, resource: str) -> int:
        # Both questions on one connection: a real scheduler reads the Node's allocatable from
        # its cache, so the stand-in should not spend two connection set-ups on each look.
        async with open_unix_channel(self.socket) as channel:
            healthy = set((await allocatable_on(channel)).get(resource, []))
            return len(healthy - await self._assigned(channel, resource))

    async def _assigned(self, channel: grpc.aio.Channel, resource: str) -> set[str]:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
        reply = await stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=2.0)
        return {
            device_id
            for pod in reply.pod_resources
            for container in pod.containers
            for devices in container.devices
            if devices.resource_name == resource
            for device_id in devices.device_ids
        }


def require(condition: bool, message: str) -> None:
    """A check the demo makes on what it sees; failing it ends the demo with the message."""
    if not condition:
        raise DemoError(message)
