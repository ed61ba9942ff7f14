"""The one way a service builds its Kubernetes API client.

With `KUBECONFIG` set the client follows that file (tests and the simulated cluster); inside a
Pod it uses the in-cluster configuration: the projected token, CA and namespace the DaemonSet
mounts into the containers that talk to the API server (the watcher; the allocator in DRA mode).
"""

from __future__ import annotations

from kubernetes import client
from kubernetes import config as kube_config


def api_client(kubeconfig: str | None) -> client.ApiClient:
    if kubeconfig:
        return kube_config.new_client_from_config(config_file=kubeconfig)
    configuration = client.Configuration()
    kube_config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)
