"""Configuration from the environment (DESIGN.md section 4), read and validated in one place.

Every service calls `load()` once at start; a bad value stops the process with one sentence naming
the variable, the value and what is expected.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from partkeeper.errors import StartupError

DEFAULT_METRICS_PORTS = {"watcher": 9401, "allocator": 9402, "reclaimer": 9403, "gc": 9404}


class ConfigError(StartupError, ValueError):
    """A configuration value is missing or malformed; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Config:
    nats_urls: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    nats_user: str | None = None
    nats_password: str | None = None
    nats_creds: str | None = None
    node: str = field(default_factory=socket.gethostname)
    kubeconfig: str | None = None
    kubelet_dir: Path = Path("/var/lib/kubelet/device-plugins")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    pods_dir: Path = Path("/var/lib/partkeeper/pods")
    driver: Literal["nvml", "sim"] = "nvml"
    sim_state: Path = Path("/var/lib/partkeeper/sim.json")
    foreign_policy: Literal["keep", "reap"] = "keep"
    foreign_grace_seconds: float = 300.0
    metrics_port: int | None = None  # None: the service's default
    resync_seconds: float = 10.0
    stream_replicas: int = 1
    slices_per_card: int = 4
    resource_prefix: str = "nvidia.com/mig-"
    sliced_resource: str = "nvidia.com/gpu.sliced"
    device_list_strategy: Literal["envvar", "cdi"] = "envvar"
    cdi_dir: Path = Path("/var/run/cdi")
    driver_root: Path = Path("/")  # where the driver's /dev lives on the host (device specs)
    proc_root: Path = Path("/proc")  # where the driver's /proc/driver/nvidia is read
    mode: Literal["deviceplugin", "dra"] = "deviceplugin"
    kubelet_plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    kubelet_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")

    def metrics_port_for(self, service: str) -> int:
        if self.metrics_port is not None:
            return self.metrics_port
        return DEFAULT_METRICS_PORTS.get(service, 0)


def _choice(env: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = env.get(name, default).strip() or default
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not valid; expected one of: {', '.join(allowed)}")
    return value


def _number(env: Mapping[str, str], name: str, default: float, *, minimum: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum:g}")
    return value


def _integer(env: Mapping[str, str], name: str, default: int | None, *, minimum: int) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise ConfigError(f"{name}={raw!r} is not a whole number")
    value = int(raw)
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum}")
    return value


def _nats_urls(env: Mapping[str, str]) -> tuple[str, ...]:
    raw = env.get("NATS_URL", "").strip() or "nats://127.0.0.1:4222"
    urls = tuple(u.strip() for u in raw.split(",") if u.strip())
    for url in urls:
        if "://" not in url:
            raise ConfigError(f"NATS_URL entry {url!r} has no scheme; expected nats://host:port")
    return urls


def load(env: Mapping[str, str] | None = None) -> Config:
    """Read the configuration from `env` (default: the process environment)."""
    env = os.environ if env is None else env
    node = env.get("PK_NODE_NAME", "").strip() or socket.gethostname()
    if not node or len(node) > 253:
        raise ConfigError(f"PK_NODE_NAME={node!r} must be 1 to 253 characters")
    from partkeeper.faults import parse as parse_faults  # validated here, applied by faults

    parse_faults(env.get("PK_FAULTS", "").strip())
    kubelet_dir = Path(env.get("PK_KUBELET_DIR") or "/var/lib/kubelet/device-plugins")
    return Config(
        nats_urls=_nats_urls(env),
        nats_user=env.get("NATS_USER") or None,
        nats_password=env.get("NATS_PASSWORD") or None,
        nats_creds=env.get("NATS_CREDS") or None,
        node=node,
        kubeconfig=env.get("KUBECONFIG") or None,
        kubelet_dir=kubelet_dir,
        pod_resources_socket=Path(
            env.get("PK_POD_RESOURCES_SOCKET") or "/var/lib/kubelet/pod-resources/kubelet.sock"
        ),
        pods_dir=Path(env.get("PK_PODS_DIR") or "/var/lib/partkeeper/pods"),
        driver=_choice(env, "PK_DRIVER", "nvml", ("nvml", "sim")),  # type: ignore[arg-type]
        sim_state=Path(env.get("PK_SIM_STATE") or "/var/lib/partkeeper/sim.json"),
        foreign_policy=_choice(env, "PK_FOREIGN_POLICY", "keep", ("keep", "reap")),  # type: ignore[arg-type]
        foreign_grace_seconds=_number(env, "PK_FOREIGN_GRACE_SECONDS", 300.0, minimum=0),
        metrics_port=_integer(env, "PK_METRICS_PORT", None, minimum=0),
        resync_seconds=_number(env, "PK_RESYNC_SECONDS", 10.0, minimum=0.05),
        stream_replicas=_integer(env, "PK_STREAM_REPLICAS", 1, minimum=1) or 1,
        slices_per_card=_integer(env, "PK_SLICES_PER_CARD", 4, minimum=1) or 4,
        resource_prefix=env.get("PK_RESOURCE_PREFIX") or "nvidia.com/mig-",
        sliced_resource=env.get("PK_SLICED_RESOURCE") or "nvidia.com/gpu.sliced",
        device_list_strategy=_choice(  # type: ignore[arg-type]
            env, "PK_DEVICE_LIST_STRATEGY", "envvar", ("envvar", "cdi")
        ),
        cdi_dir=Path(env.get("PK_CDI_DIR") or "/var/run/cdi"),
        driver_root=Path(env.get("PK_DRIVER_ROOT") or "/"),
        proc_root=Path(env.get("PK_PROC_ROOT") or "/proc"),
        mode=_choice(env, "PK_MODE", "deviceplugin", ("deviceplugin", "dra")),  # type: ignore[arg-type]
        # DRA mode's dirs default to siblings of the device-plugin dir, as kubelet lays them out.
        kubelet_plugins_dir=Path(
            env.get("PK_KUBELET_PLUGINS_DIR") or kubelet_dir.parent / "plugins"
        ),
        kubelet_registry_dir=Path(
            env.get("PK_KUBELET_REGISTRY_DIR") or kubelet_dir.parent / "plugins_registry"
        ),
    )
