"""The simulated kubelet (docs/contract.md section 6): device-plugin registration and ListAndWatch,
Pod admission with Allocate, device freeing on termination, pod-resources v1.

The core (`SimKubelet`) learns about Pods through a `PodSource`: `MemoryPodSource` in process,
`cluster.ClusterPodSource` on a Kubernetes API server (imported from its module, so the core does
not need the `kubernetes` client).
"""

from partkeeper_sim.kubelet.admission import Shortage, choose, natural_key
from partkeeper_sim.kubelet.kubelet import (
    CREATE_CONTAINER_ERROR,
    UNEXPECTED_ADMISSION_ERROR,
    AdmissionError,
    SimKubelet,
)
from partkeeper_sim.kubelet.plugins import PluginCallError
from partkeeper_sim.kubelet.podresources import PodAssignment
from partkeeper_sim.kubelet.pods import (
    ContainerView,
    PodEvent,
    PodSpecError,
    PodView,
    is_extended_resource,
    pod_from_manifest,
    pod_manifest,
)
from partkeeper_sim.kubelet.records import HOLDING, ContainerRecord, PodRecord, PodState
from partkeeper_sim.kubelet.source import MemoryPodSource, PhaseReport, PodSource

__all__ = [
    "CREATE_CONTAINER_ERROR",
    "HOLDING",
    "UNEXPECTED_ADMISSION_ERROR",
    "AdmissionError",
    "ContainerRecord",
    "ContainerView",
    "MemoryPodSource",
    "PhaseReport",
    "PluginCallError",
    "PodAssignment",
    "PodEvent",
    "PodRecord",
    "PodSource",
    "PodSpecError",
    "PodState",
    "PodView",
    "Shortage",
    "SimKubelet",
    "choose",
    "is_extended_resource",
    "natural_key",
    "pod_from_manifest",
    "pod_manifest",
]
