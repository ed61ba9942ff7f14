"""kubelet's pod-resources API, read to narrow which container an Allocate serves.

While kubelet waits for our Allocate, it lists the container it is admitting without devices of
that resource; containers already served list theirs. The answer is optional: when the socket is
absent or the call fails, the caller goes on without narrowing (and says so in its log).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import grpc
import grpc.aio

from partkeeper.kubelet import open_unix_channel, podresources_pb2, podresources_pb2_grpc

log = logging.getLogger(__name__)

# (namespace, name) -> container -> resources the container already holds devices of
KubeletView = Mapping[tuple[str, str], Mapping[str, frozenset[str]]]


class PodResources:
    def __init__(self, socket: Path, *, timeout: float = 1.0) -> None:
        self.socket = Path(socket)
        self.timeout = timeout
        self._channel: grpc.aio.Channel | None = None

    async def view(self) -> KubeletView | None:
        """Every Pod kubelet knows with its containers' device holdings; None when unavailable."""
        if not self.socket.exists():
            return None
        if self._channel is None:
            self._channel = open_unix_channel(self.socket)
        stub = podresources_pb2_grpc.PodResourcesListerStub(self._channel)
        try:
            reply = await stub.List(podresources_pb2.ListPodResourcesRequest(),
                                    timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            log.info("pod-resources at %s did not answer (%s); not narrowing", self.socket,
                     exc.code().name)
            await self.close()
            return None
        return {
            (pod.namespace, pod.name): {
                c.name: frozenset(d.resource_name for d in c.devices if d.device_ids)
                for c in pod.containers
            }
            for pod in reply.pod_resources
        }

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()
