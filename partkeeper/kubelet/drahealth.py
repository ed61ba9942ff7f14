"""The kubelet's DRA resource-health stream (KEP-4680, `k8s.io/kubelet/pkg/apis/dra-health`): its
versions, newest first, each with its generated message and stub modules.

One table for both sides: the DRA plugin serves every version and lists them in its registration,
and the simulated kubelet picks the newest one a plugin lists, as a 1.36 kubelet does
(docs/dra.md, "The resource-health stream").
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from partkeeper.kubelet import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_health_v1beta1_pb2,
    dra_health_v1beta1_pb2_grpc,
)

HEALTH_APIS: Mapping[str, tuple[ModuleType, ModuleType]] = {
    "v1": (dra_health_v1_pb2, dra_health_v1_pb2_grpc),
    "v1beta1": (dra_health_v1beta1_pb2, dra_health_v1beta1_pb2_grpc),
    "v1alpha1": (dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
}


def service_name(version: str) -> str:
    """The gRPC service a registration lists for `version`, e.g. `v1.DRAResourceHealth`."""
    return f"{version}.DRAResourceHealth"


HEALTH_SERVICES: tuple[str, ...] = tuple(service_name(v) for v in HEALTH_APIS)
