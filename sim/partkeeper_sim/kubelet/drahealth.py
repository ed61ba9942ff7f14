"""The simulated kubelet's DRA resource-health client: one `NodeWatchResources` stream per
registered driver, as kubelet 1.36 keeps one (k8s.io/kubernetes pkg/kubelet/cm/dra).

- The version is picked from the plugin's registration `supported_versions`: the newest of
  `v1.DRAResourceHealth`, `v1beta1.DRAResourceHealth`, `v1alpha1.DRAResourceHealth` it lists,
  none when it lists none (plugin/dra_plugin_manager_test.go, TestPickHealthService).
- Each response is the driver's complete list; every device named is stored with the time it
  arrived, and keeps its health until its timeout (`health_check_timeout_seconds`, else 30 s)
  passes without news (healthinfo.go, `updateHealthInfo`, `getHealthInfo`).
- A stream that ends or fails clears the driver's entries, so its devices read Unknown
  (manager.go, `HandleWatchResourcesStream`: `clearDriver` on exit), and is opened again after
  `RETRY_SECONDS` (dra_plugin_manager.go: `wait.UntilWithContext(..., 5*time.Second)`); one
  answered Unimplemented is not asked again until the driver registers anew
  (TestHealthStreamUnimplemented).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from types import ModuleType

import grpc

from partkeeper.kubelet import (
    open_unix_channel,
)
from partkeeper.kubelet.drahealth import HEALTH_APIS, service_name
from partkeeper_sim.kubelet.resourcehealth import (
    DEFAULT_TIMEOUT,
    HEALTHY,
    UNHEALTHY,
    UNKNOWN,
    Reported,
)

log = logging.getLogger(__name__)

RETRY_SECONDS = 5.0
SERVICES: dict[str, tuple[ModuleType, ModuleType]] = {  # newest first
    service_name(version): modules for version, modules in HEALTH_APIS.items()}
_WORDS = {0: UNKNOWN, 1: HEALTHY, 2: UNHEALTHY}

Key = tuple[str, str, str]  # driver, pool, device


def pick_service(supported: Sequence[str]) -> str:
    """The health service a kubelet asks a plugin for, "" for none."""
    return next((name for name in SERVICES if name in supported), "")


class HealthStreams:
    """Every registered driver's stream; `reported` is what they said, `on_change` is called
    after each response and each cleared driver."""

    def __init__(self, plugins: Callable[[], dict[str, str]],
                 services: Callable[[str], Sequence[str]],
                 registration: Callable[[str], int], on_change: Callable[[], None], *,
                 poll: float = 0.05, retry: float = RETRY_SECONDS) -> None:
        self._plugins = plugins
        self._services = services
        self._registration = registration
        self._on_change = on_change
        self.poll = poll
        self.retry = retry
        self.reported: dict[Key, Reported] = {}
        self.chosen: dict[str, str] = {}  # driver -> the service its stream uses (tests)
        self._streams: dict[str, tuple[int, asyncio.Task[None]]] = {}
        self._unimplemented: dict[str, int] = {}  # driver -> the registration that said so
        self._next_try: dict[str, float] = {}

    async def run(self) -> None:
        try:
            while True:
                self._start_streams()
                await asyncio.sleep(self.poll)
        finally:
            tasks = [task for _, task in self._streams.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _start_streams(self) -> None:
        now = time.monotonic()
        for driver, socket in self._plugins().items():
            registration = self._registration(driver)
            running = self._streams.get(driver)
            if running is not None and running[0] == registration and not running[1].done():
                continue
            if running is not None and running[0] != registration:
                running[1].cancel()
                self._next_try.pop(driver, None)
            if self._unimplemented.get(driver) == registration:
                continue
            if now < self._next_try.get(driver, 0.0):
                continue
            service = pick_service(self._services(driver))
            if not service:
                continue
            self.chosen[driver] = service
            task = asyncio.create_task(self._watch(driver, socket, service, registration),
                                       name=f"sim-kubelet health {driver}")
            self._streams[driver] = (registration, task)

    async def _watch(self, driver: str, socket: str, service: str, registration: int) -> None:
        pb2, pb2_grpc = SERVICES[service]
        try:
            async with open_unix_channel(socket) as channel:
                stream = pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                    pb2.NodeWatchResourcesRequest())
                async for answer in stream:
                    self._take(driver, answer)
            log.info("the health stream of %s ended; again in %gs", driver, self.retry)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("DRA driver %s serves no %s; not asked again until it registers anew",
                         driver, service)
                self._unimplemented[driver] = registration
            else:
                log.info("the health stream of %s failed (%s); again in %gs", driver,
                         exc.code(), self.retry)
        finally:
            self._next_try[driver] = time.monotonic() + self.retry
            self._clear(driver)

    def _take(self, driver: str, answer: object) -> None:
        now = time.monotonic()
        for device in answer.devices:  # type: ignore[attr-defined]
            timeout = float(getattr(device, "health_check_timeout_seconds", 0) or 0)
            key = (driver, device.device.pool_name, device.device.device_name)
            self.reported[key] = Reported(_WORDS.get(device.health, UNKNOWN),
                                          getattr(device, "message", ""), now,
                                          timeout if timeout > 0 else DEFAULT_TIMEOUT)
        self._on_change()

    def _clear(self, driver: str) -> None:
        gone = [key for key in self.reported if key[0] == driver]
        for key in gone:
            del self.reported[key]
        if gone:
            self._on_change()
