"""The one way a service builds its Kubernetes API client.

With `KUBECONFIG` set the client follows that file (tests and the simulated cluster); inside a
Pod it uses the in-cluster configuration: the projected token, CA and namespace the DaemonSet
mounts into the containers that talk to the API server (the watcher; the allocator in DRA mode).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kubernetes import client
from kubernetes import config as kube_config


def api_client(kubeconfig: str | None) -> client.ApiClient:
    if kubeconfig:
        return kube_config.new_client_from_config(config_file=kubeconfig)
    configuration = client.Configuration()
    kube_config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)


async def connect(kubeconfig: str | None, error: Callable[[str], Exception]) -> client.ApiClient:
    """`api_client`, built off the event loop (it reads files); what stops it is raised as
    `error(message)`, naming where the configuration came from."""
    try:
        return await asyncio.to_thread(api_client, kubeconfig)
    except Exception as exc:
        source = f"KUBECONFIG={kubeconfig}" if kubeconfig else "in-cluster config"
        raise error(f"cannot configure API server access from {source}: {exc}") from exc
