"""podman, the services' image and the compose stack, for the container tests (tests/containers/).

What the tests run is the real thing: Debian's podman with runc, the repository's Dockerfile built
by `make image`, and compose/docker-compose.yml brought up by podman-compose. What this machine
lacks is stood in for, and only that (tests/containers/README.md): the base images no registry
serves (base-image.sh, nats-image.sh), Jaeger (compose.stand-ins.yml), and two things podman 4.3
leaves to systemd or to a newer podman, which `Compose.up` does as docker compose would:

- healthchecks run on a systemd timer, and there is no systemd here: `Compose.healthy` runs the
  compose file's healthcheck (`podman healthcheck run`) until it passes or the deadline ends;
- podman-compose honours `depends_on` conditions only on podman 4.6 and later: `Compose.up`
  starts the services in dependency order and waits for each condition the file names
  (service_started, service_healthy, service_completed_successfully) before starting a dependent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "containers"
CONTAINERS_CONF = HERE / "containers.conf"
COMPOSE_FILE = ROOT / "compose" / "docker-compose.yml"
STAND_INS = HERE / "compose.stand-ins.yml"
# crun refuses this machine's hybrid cgroup layout (runc is the runtime), and raising
# RLIMIT_NPROC is not permitted here, so every build and run sets low limits itself.
ULIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SLIM_IMAGE = f"partkeeper:{VERSION}"  # `make image`'s default name: no simulator
SERVICE_IMAGE = "partkeeper:dev"  # what compose/docker-compose.yml names its services' image
DEADLINE = 120.0  # one wait of the rig; a bound, never an expectation


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF), **(extra or {})}


def absent() -> str | None:
    """Why the container tests cannot run here, or None when they can."""
    if shutil.which("podman") is None:
        return "podman is not installed (tests/containers/setup.sh installs it)"
    if podman_compose() is None:
        return "podman-compose is not installed (tests/containers/setup.sh installs it)"
    return None


def podman_compose() -> str | None:
    beside = Path(sys.executable).parent / "podman-compose"
    return str(beside) if beside.exists() else shutil.which("podman-compose")


def podman(*args: str, timeout: float = DEADLINE, check: bool = True,
           ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                            env=environment())
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout}{result.stderr}")
    return result


def run_image(image: str, *argv: str, entrypoint: str | None = None, timeout: float = 60,
              ) -> subprocess.CompletedProcess[str]:
    """`podman run --rm` of `image` with the rig's limits; not checked."""
    extra = ["--entrypoint", entrypoint] if entrypoint else []
    return podman("run", "--rm", *ULIMITS, *extra, image, *argv, timeout=timeout, check=False)


def make_image(image: str, extras: str = "") -> float:
    """`make image` with podman (the real Dockerfile); the seconds it took."""
    started = time.monotonic()
    result = subprocess.run(
        ["make", "-s", "image", "ENGINE=podman", f"EXTRAS={extras}", f"IMAGE={image}",
         f"BUILD_FLAGS={' '.join(ULIMITS)}"],
        capture_output=True, text=True, cwd=ROOT, timeout=900, env=environment())
    if result.returncode != 0:
        raise AssertionError(f"make image EXTRAS={extras} failed:\n{result.stdout[-4000:]}"
                             f"{result.stderr[-4000:]}")
    return time.monotonic() - started


@dataclass(frozen=True, slots=True)
class Dependency:
    service: str
    condition: str  # service_started | service_healthy | service_completed_successfully


def dependencies(service: Mapping[str, Any]) -> list[Dependency]:
    """A service's `depends_on`, in either of the compose file's spellings."""
    found = service.get("depends_on") or {}
    if isinstance(found, list):
        return [Dependency(name, "service_started") for name in found]
    return [Dependency(name, (how or {}).get("condition", "service_started"))
            for name, how in found.items()]


def start_order(services: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The services, each after everything it depends on (ties by name)."""
    placed: list[str] = []
    waiting = dict(sorted(services.items()))
    while waiting:
        ready = [name for name, spec in waiting.items()
                 if all(d.service in placed for d in dependencies(spec))]
        if not ready:
            raise AssertionError(f"depends_on has a cycle among {sorted(waiting)}")
        for name in ready:
            placed.append(name)
            del waiting[name]
    return placed


class Compose:
    """compose/docker-compose.yml with the test's stand-ins, as project `partkeeper`."""

    def __init__(self, otlp_out: Path) -> None:
        self.otlp_out = otlp_out
        self.env = environment({"PK_OTLP_OUT": str(otlp_out)})
        self._config: dict[str, Any] | None = None

    def run(self, *args: str, timeout: float = 300, check: bool = True,
            ) -> subprocess.CompletedProcess[str]:
        command = [podman_compose() or "podman-compose", "-f", str(COMPOSE_FILE),
                   "-f", str(STAND_INS), "--in-pod", "false",
                   *(f"--podman-run-args={flag}={value}"
                     for flag, value in zip(ULIMITS[::2], ULIMITS[1::2], strict=True)),
                   *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                env=self.env, cwd=ROOT)
        if check and result.returncode != 0:
            raise AssertionError(f"podman-compose {' '.join(args)} exited {result.returncode}:"
                                 f"\n{result.stdout[-4000:]}{result.stderr[-4000:]}")
        return result

    @property
    def config(self) -> dict[str, Any]:
        """The compose file as podman-compose resolves it (anchors, the stand-ins merged)."""
        if self._config is None:
            self._config = yaml.safe_load(self.run("config").stdout)
        return self._config

    @property
    def project(self) -> str:
        return str(self.config["name"])

    def service(self, name: str) -> dict[str, Any]:
        return dict(self.config["services"][name])

    def containers(self, *, running_only: bool = False) -> list[dict[str, Any]]:
        """The project's containers (`podman ps --format json`)."""
        args = ["ps", "--format", "json", "--filter",
                f"label=com.docker.compose.project={self.project}"]
        found = json.loads(podman(*args, *([] if running_only else ["-a"])).stdout or "[]")
        return list(found)

    def container(self, service: str) -> str:
        """The name of the service's one container."""
        names = [c["Names"][0] for c in self.containers()
                 if c.get("Labels", {}).get("com.docker.compose.service") == service]
        if len(names) != 1:
            raise AssertionError(f"service {service}: containers {names}, expected one")
        return names[0]

    def inspect(self, service: str) -> dict[str, Any]:
        return dict(json.loads(podman("inspect", self.container(service)).stdout)[0])

    def logs(self, service: str) -> str:
        result = podman("logs", self.container(service), check=False)
        return result.stdout + result.stderr

    def exec(self, service: str, *argv: str, timeout: float = 60,
             ) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.container(service), *argv, timeout=timeout, check=False)

    def healthy(self, service: str, timeout: float = DEADLINE) -> None:
        """Run the service's compose healthcheck until it passes, every `interval` of the file,
        as podman's timer would; fails at the deadline with the service's last log lines."""
        interval = _seconds(self.service(service).get("healthcheck", {}).get("interval", "2s"))
        deadline = time.monotonic() + timeout
        while True:
            result = podman("healthcheck", "run", self.container(service), check=False)
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{service} not healthy within {timeout}s "
                                     f"({result.stdout.strip()} {result.stderr.strip()}); "
                                     f"its log ends:\n{self.logs(service)[-3000:]}")
            time.sleep(interval)

    def completed(self, service: str, timeout: float = DEADLINE) -> None:
        """Wait for the service's container to exit, failing unless it exited 0."""
        name = self.container(service)
        code = podman("wait", name, timeout=timeout).stdout.strip()
        if code != "0":
            raise AssertionError(f"{service} exited {code}; its log ends:\n"
                                 f"{self.logs(service)[-3000:]}")

    def up(self) -> None:
        """Every service, each started once what it depends on meets the file's condition."""
        services = self.config["services"]
        for name in start_order(services):
            for dep in dependencies(services[name]):
                if dep.condition == "service_healthy":
                    self.healthy(dep.service)
                elif dep.condition == "service_completed_successfully":
                    self.completed(dep.service)
            self.run("up", "-d", "--no-deps", name)

    def down(self) -> subprocess.CompletedProcess[str]:
        """`podman-compose down -v`: the containers, the network and the named volumes."""
        return self.run("down", "-v", check=False)


def _seconds(duration: str | int | float) -> float:
    """A compose duration (`5s`, `1m30s`, `500ms`) in seconds."""
    if isinstance(duration, int | float):
        return float(duration)
    total, number = 0.0, ""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    text = duration.strip()
    i = 0
    while i < len(text):
        if text[i].isdigit() or text[i] == ".":
            number += text[i]
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else text[i]
        total += float(number) * units[unit]
        number = ""
        i += len(unit)
    return total


def proc_status(compose: Compose, service: str) -> dict[str, str]:
    """/proc/1/status of the service's container, as fields."""
    text = compose.exec(service, "cat", "/proc/1/status").stdout
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def proc_environ(compose: Compose, service: str) -> dict[str, str]:
    """The environment PID 1 of the service's container runs with."""
    raw = compose.exec(service, "cat", "/proc/1/environ").stdout
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def image_has(image: str, paths: Sequence[str]) -> list[str]:
    """Those of `paths` (globs) present in `image`."""
    script = ("import glob, sys; print('\\n'.join(p for a in sys.argv[1:] "
              "for p in glob.glob(a)))")
    result = run_image(image, "-c", script, *paths, entrypoint="python")
    assert result.returncode == 0, result.stderr
    return [line for line in result.stdout.splitlines() if line]
