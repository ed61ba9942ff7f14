"""Starting and stopping the simulated API server, in a running event loop or in its own thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from aiohttp import web

from .admin import Admin
from .routes import build_app
from .state import ServerState
from .store import Store
from .watch import WatchHub

T = TypeVar("T")
ADMIN_TIMEOUT = 30.0


class ApiServer(Admin):
    """The server on the caller's event loop: `await start()` ... `await stop()`.

    The admin methods (see `Admin`) may be called from the loop or from any other thread.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        bookmark_interval: float = 1.0,
        history_limit: int = 10_000,
        auto_create_nodes: bool = True,
        partitionable_devices: bool = True,
    ) -> None:
        """`partitionable_devices`: the kube-apiserver feature gate DRAPartitionableDevices."""
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        store = Store(history_limit=history_limit, partitionable_devices=partitionable_devices)
        self._state = ServerState(
            store,
            WatchHub(store),
            bookmark_interval=bookmark_interval,
            auto_create_nodes=auto_create_nodes,
        )
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the simulated API server is not started")
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the simulated API server is already started")
        # Cancelling a handler when its client goes away is what ends an abandoned watch.
        runner = web.AppRunner(
            build_app(self._state),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=5.0,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self._requested_port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._loop = runner, asyncio.get_running_loop()
        self._port = runner.addresses[0][1]

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self._state.hub.end_all()
        await runner.cleanup()
        self._loop = None

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    def _run(self, fn: Callable[[], T]) -> T:
        loop = self._loop
        if loop is None or _running_loop() is loop:
            return fn()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            try:
                future.set_result(fn())
            except BaseException as error:  # handed to the calling thread
                future.set_exception(error)

        loop.call_soon_threadsafe(call)
        return future.result(ADMIN_TIMEOUT)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class ApiServerThread(Admin):
    """The server on its own event loop in a daemon thread, for synchronous callers.

    `start()` returns once the server listens; `stop()` shuts it down and joins the thread.
    Usable as a context manager.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        self.server = ApiServer(host, port, **options)
        self._state = self.server._state
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    def start(self, timeout: float = 30.0) -> ApiServerThread:
        if self._thread is not None:
            raise RuntimeError("the simulated API server thread is already started")
        loop = asyncio.new_event_loop()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        thread = threading.Thread(
            target=self._main, args=(loop, started), name="sim-apiserver", daemon=True
        )
        thread.start()
        try:
            started.result(timeout)
        except BaseException:
            thread.join(timeout)
            raise
        self._thread, self._loop = thread, loop
        return self

    def _main(
        self, loop: asyncio.AbstractEventLoop, started: concurrent.futures.Future[None]
    ) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self.server.start())
        except BaseException as error:  # handed to the starting thread
            started.set_exception(error)
            loop.close()
            return
        started.set_result(None)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self.server.stop())
            loop.close()

    def stop(self, timeout: float = 30.0) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        self._thread = self._loop = None
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

    def __enter__(self) -> ApiServerThread:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self, fn: Callable[[], T]) -> T:
        return self.server._run(fn)
