"""Starting the embedded stack in order, each part ready before the next needs it.

NATS (tier 0, with a user per role: natsserver.EmbeddedUsers) -> `partkeeper provision` (the
streams and buckets, as the provisioning user) -> the simulated cluster (tier 1: API server,
kubelet, cards) -> the four services (tier 2, each as its own user), then the services answer on
NATS and the kubelet offers the allocator's resources. Stopping is the reverse (processes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import sysconfig
import time
import uuid
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from partkeeper import bootid
from partkeeper.bus.permissions import inbox_prefix
from partkeeper.bus.topology import ProvisionError, provision
from partkeeper.config import Config, ConfigError, load
from partkeeper.drivers import profiles
from partkeeper.faults import FaultSpecError
from partkeeper_sim.stack import readiness
from partkeeper_sim.stack.layout import Layout, write_env
from partkeeper_sim.stack.natsserver import ADMIN, EmbeddedUsers, binary, free_port
from partkeeper_sim.stack.processes import (
    Child,
    ChildExited,
    StackError,
    Supervisor,
    describe_exit,
)
from schemas.names import (
    SERVICE_ALLOCATOR,
    SERVICE_RECLAIMER,
    SERVICE_WATCHER,
    STREAM_PODS,
    durable_name,
    encode_token,
)

NODE = "sim-node-0"
CARDS = ("H100-80GB", "H100-80GB")
SLICED = ("A100-40GB",)
SERVICES = ("watcher", "allocator", "reclaimer", "gc")
MICRO_SERVICES = {"watcher": SERVICE_WATCHER, "allocator": SERVICE_ALLOCATOR,
                  "reclaimer": SERVICE_RECLAIMER}
TIER_NATS, TIER_CLUSTER, TIER_SERVICES = 0, 1, 2

NATS_READY_SECONDS = 20.0
CLUSTER_READY_SECONDS = 45.0
SERVICES_READY_SECONDS = 90.0
KUBELET_READY_SECONDS = 45.0
PROVISION_SECONDS = 30.0
# Whatever the caller's shell says, the services reach the embedded server with the users made
# for it, not some other NATS or identity.
_DROPPED = ("NATS_USER", "NATS_PASSWORD", "NATS_CREDS", "PK_FAULTS")


@dataclass(frozen=True, slots=True)
class Stack:
    """Where everything of a running stack is."""

    layout: Layout
    node: str
    nats_url: str
    api_url: str
    config: Config  # what the services were started with
    nc: Client  # up's own connection, for readiness and the demo
    envs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # per service
    admin: Mapping[str, str] = field(default_factory=dict)  # NATS_USER/NATS_PASSWORD, if any

    @property
    def kubeconfig(self) -> Path:
        return self.layout.cluster.kubeconfig

    @property
    def auth(self) -> dict[str, str]:
        """nats.connect keyword arguments for the stack's admin login (none: an open server)."""
        if not self.admin:
            return {}
        return {"user": self.admin["NATS_USER"], "password": self.admin["NATS_PASSWORD"]}

    def shell_env(self) -> dict[str, str]:
        """What `partkeeper status`, `partkeeper sim` and a Kubernetes client need."""
        return {
            "NATS_URL": self.nats_url,
            **self.admin,
            "PK_NODE_NAME": self.node,
            "KUBECONFIG": str(self.kubeconfig),
            "PK_SIM_STATE": str(self.layout.cluster.sim_state),
        }


def service_env(layout: Layout, nats_url: str, base: Mapping[str, str]) -> dict[str, str]:
    paths = layout.cluster
    env = {k: v for k, v in base.items() if k not in _DROPPED}
    env.update({
        "NATS_URL": nats_url,
        "PK_NODE_NAME": NODE,
        "KUBECONFIG": str(paths.kubeconfig),
        "PK_KUBELET_DIR": str(paths.device_plugin_dir),
        "PK_POD_RESOURCES_SOCKET": str(paths.pod_resources_socket),
        "PK_PODS_DIR": str(layout.pods_dir),
        "PK_DRIVER": "sim",
        "PK_SIM_STATE": str(paths.sim_state),
        "PK_PROC_ROOT": str(proc_root(layout)),
        "PK_METRICS_PORT": "0",
        "PK_RESYNC_SECONDS": "1",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def proc_root(layout: Layout) -> Path:
    """The simulated host's `/proc`, as far as the services read it: its boot id (a test that
    simulates a reboot writes a new one there after `partkeeper sim reboot`)."""
    return layout.root / "proc"


def boot(layout: Layout) -> None:
    """Give the simulated host a boot id, once: a stack started again on the same working dir
    is the same boot (its cards kept their partitions), so an existing one is kept."""
    if not bootid.path(proc_root(layout)).exists():
        bootid.write(proc_root(layout), str(uuid.uuid4()))


def offered_resources(config: Config) -> list[str]:
    """The resources the allocator registers for the embedded cards (docs/contract.md section 5)."""
    names = {name for model in CARDS for name in profiles.model(model).profiles}
    found = [f"{config.resource_prefix}{name}" for name in sorted(names)]
    if SLICED:
        found.append(config.sliced_resource)
    return found


async def launch(
    layout: Layout,
    supervisor: Supervisor,
    *,
    nats_url: str | None = None,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    credentials: tuple[str, str] | None = None,
    users: EmbeddedUsers | None = None,
    mode: str = "deviceplugin",
) -> Stack:
    """Start everything and return once it is all ready; raises StackError/ChildExited.

    `nats_url` (comma separated) names NATS servers someone else runs (a cluster, a server with
    an authorization config) instead of starting one; `overrides` adds variables per service
    (credentials, PK_FAULTS, PK_STREAM_REPLICAS), after the ones `up` drops from its own;
    `credentials` (user, password) are for the stack's own connection (readiness, probes);
    `users` are the logins of every role on those servers (the stack's own server gets new
    ones); overrides name "provision" too. `mode` "dra" runs the cluster's DRA scheduler and
    kubelet and the allocator in DRA mode; "both" runs the cluster's device-plugin and DRA sides
    together with the allocator in device-plugin mode (a node about to move to DRA, migrate.py).
    """
    port = free_port()
    own_nats = nats_url is None
    nats_url = nats_url or f"nats://127.0.0.1:{port}"
    if own_nats:
        users = users or EmbeddedUsers.made()
    env = service_env(layout, nats_url, os.environ)
    boot(layout)
    if mode == "dra":
        env.update({"PK_MODE": "dra", "PK_CDI_DIR": str(layout.root / "cdi")})
    elif mode == "both":
        env["PK_CDI_DIR"] = str(layout.root / "cdi")  # where DRA mode writes, once switched

    def env_of(role: str) -> dict[str, str]:
        login = users.env(role) if users else {}
        return {**env, **login, **(overrides or {}).get(role, {})}

    envs = {name: env_of(name) for name in SERVICES}
    try:
        # The services would refuse a bad value one by one; say it once, up front.
        config = [load(envs[name]) for name in SERVICES][SERVICES.index("allocator")]
        provisioning = load(env_of("provision"))
    except (ConfigError, FaultSpecError) as exc:
        raise StackError(f"the services cannot start with this environment: {exc}") from exc
    if own_nats:
        assert users is not None
        conf = users.write_config(layout.root / "nats.conf", NODE)
        await _start_nats(layout, supervisor, port, conf)
    guard = supervisor.guard
    credentials = credentials or (users.logins[ADMIN] if users else None)
    nc = await guard(readiness.connect_nats(nats_url, *(credentials or ()),
                                            inbox=inbox_prefix(ADMIN, encode_token(NODE))),
                     timeout=NATS_READY_SECONDS, what="the NATS server", log=layout.log("nats"))
    try:
        await _provision(layout, supervisor, provisioning)
        cluster = await _start_cluster(layout, supervisor, mode)
        for name in SERVICES:
            await start_service(layout, supervisor, name, envs[name])
        await _services_ready(layout, supervisor, nc)
        if config.mode == "dra":
            from partkeeper_sim.stack import dra_demo

            await guard(dra_demo.published(layout.cluster.kubeconfig, NODE),
                        timeout=KUBELET_READY_SECONDS,
                        what="the allocator's ResourceSlices", log=layout.log("allocator"))
        else:
            await guard(readiness.kubelet_offers(layout.cluster.pod_resources_socket,
                                                 offered_resources(config)),
                        timeout=KUBELET_READY_SECONDS,
                        what="the kubelet offering the allocator's resources",
                        log=layout.log("allocator"))
    except BaseException:
        await nc.close()
        raise
    admin = {"NATS_USER": credentials[0], "NATS_PASSWORD": credentials[1]} if credentials else {}
    stack = Stack(layout, NODE, nats_url, str(cluster["api"]), config, nc, envs, admin)
    write_env(layout.env_file, stack.shell_env(), path_first=Path(sysconfig.get_path("scripts")))
    return stack


async def start_service(
    layout: Layout, supervisor: Supervisor, name: str, env: Mapping[str, str]
) -> Child:
    """Start one service process (`partkeeper run <name>`); also how a test restarts one."""
    return await supervisor.start(name, [sys.executable, "-m", "partkeeper", "run", name],
                                  log_path=layout.log(name), env=env, tier=TIER_SERVICES)


async def _services_ready(layout: Layout, supervisor: Supervisor, nc: Client) -> None:
    deadline = time.monotonic() + SERVICES_READY_SECONDS
    for service in SERVICES:
        await supervisor.guard(service_ready(nc, service),
                               timeout=max(0.0, deadline - time.monotonic()),
                               what=f"the {service} service answering on NATS",
                               log=layout.log(service))


def service_ready(nc: Client, service: str) -> Awaitable[None]:
    """Each micro service answers its ping; the GC (no micro service) has its durable consumer."""
    if service in MICRO_SERVICES:
        return readiness.answers_ping(nc, MICRO_SERVICES[service])
    return readiness.consumer_exists(nc, STREAM_PODS, durable_name("gc", NODE))


async def _provision(layout: Layout, supervisor: Supervisor, config: Config) -> None:
    """`partkeeper provision` before any service starts (each service would wait for it)."""
    deadline = asyncio.get_running_loop().time() + PROVISION_SECONDS
    try:
        await supervisor.guard(provision(config, deadline=deadline),
                               timeout=PROVISION_SECONDS + 5,
                               what="provisioning the streams and buckets",
                               log=layout.log("nats"))
    except ProvisionError as exc:
        raise StackError(f"provisioning the streams and buckets failed: {exc}") from exc


async def _start_nats(layout: Layout, supervisor: Supervisor, port: int, conf: Path) -> None:
    argv = [binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(layout.nats_dir),
            "-c", str(conf)]
    await supervisor.start("nats", argv, log_path=layout.log("nats"), env=os.environ,
                           tier=TIER_NATS)


async def _start_cluster(layout: Layout, supervisor: Supervisor, mode: str = "deviceplugin"
                         ) -> dict[str, Any]:
    paths = layout.cluster
    read_fd, write_fd = os.pipe()
    argv = [
        sys.executable, "-m", "partkeeper", "sim", "cluster",
        "--workdir", str(paths.workdir), "--kubelet-dir", str(paths.kubelet_root),
        "--cards", ",".join(CARDS), "--sliced", ",".join(SLICED), "--node", NODE,
        "--notify-fd", str(write_fd), "--mode", mode,
    ]
    try:
        child = await supervisor.start("cluster", argv, log_path=layout.log("cluster"),
                                       env=os.environ, tier=TIER_CLUSTER, pass_fds=[write_fd])
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        # Only the child holds the write end now, so its exit reads as end-of-file here.
        os.close(write_fd)
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        description = await supervisor.guard(
            readiness.read_notification(pipe), timeout=CLUSTER_READY_SECONDS,
            what="the simulated cluster", log=layout.log("cluster"),
        )
    if description is None:
        with contextlib.suppress(TimeoutError):  # its exit status makes the message precise
            await asyncio.wait_for(child.proc.wait(), 5.0)
        raise ChildExited(f"the simulated cluster stopped before it was ready: "
                          f"{describe_exit(child)}")
    return description
