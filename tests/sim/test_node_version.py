"""The simulated Node and the simulated API server name one Kubernetes release: the server's
(/version, by default the release DRA mode needs), so `kubectl get nodes -o wide` and
`kubectl version` agree, as on a cluster whose kubelets match their control plane."""

from __future__ import annotations

from partkeeper_sim.apiserver import kinds
from partkeeper_sim.apiserver.discovery import version
from partkeeper_sim.apiserver.state import ServerState
from partkeeper_sim.kubelet.node import status_patch

DEFAULT_RELEASE = ServerState.__dataclass_fields__["kubernetes_version"].default


def test_the_node_reports_the_release_the_api_server_claims() -> None:
    served = version(str(DEFAULT_RELEASE))["gitVersion"]
    patch = status_patch("node-a", {}, {}, since="2026-01-01T00:00:00Z")
    assert patch["status"]["nodeInfo"]["kubeletVersion"] == served
    assert kinds._NODE_INFO["kubeletVersion"] == served
