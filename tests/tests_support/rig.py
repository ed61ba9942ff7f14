"""The embedded stack with parts that can be killed and restarted: reliability tests, the soak.

`open_rig()` starts one nats-server (or a cluster of them, `natscluster.py`) outside the
supervisor, so it can be restarted in place, then the simulated cluster and the four services
through `launch` (services and cluster are children of a `Supervisor`). A `Rig` then:

- kills a service (`kill`, SIGKILL by default) or waits for one to end by itself (`wait_exit`,
  e.g. at a fault point), telling the supervisor first so the end is not taken as a failure;
- restarts a service with extra variables (`restart(name, faults=...)`), waiting until it
  answers again;
- restarts a nats-server in place (same port, same store) or kills one for good.

Every wait has a deadline; `RigError` says what did not happen and which log to read.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from partkeeper_sim.stack.launch import NODE, SERVICES, Stack, launch, service_ready, start_service
from partkeeper_sim.stack.layout import Layout
from partkeeper_sim.stack.natsserver import EmbeddedUsers, NatsServer
from partkeeper_sim.stack.processes import Child, StackError, Supervisor, tail

RESTART_READY_SECONDS = 60.0
REVIVE_SECONDS = 0.2
EXIT_SECONDS = 60.0
# What the GC logs once its consumer runs: it has no micro service to ping, and its durable
# consumer outlives the process, so the log of the new process is the only sign it is up.
GC_READY_LINE = b"gc serving node"


class RigError(StackError):
    """A rig operation did not complete; the message names the process and its log."""


@dataclass
class Rig:
    stack: Stack
    supervisor: Supervisor
    servers: list[NatsServer]
    credentials: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    @property
    def layout(self) -> Layout:
        return self.stack.layout

    def child(self, name: str) -> Child:
        """The latest process started under `name`."""
        found = [c for c in self.supervisor.children if c.name == name]
        if not found:
            raise RigError(f"no process named {name} was started")
        return found[-1]

    def alive(self, name: str) -> bool:
        return self.child(name).status is None

    async def kill(self, name: str, signum: int = signal.SIGKILL) -> int:
        """Signal the service; its exit status (negative: the signal) once reaped."""
        return await self.supervisor.kill(self.child(name), signum)

    def expect_exit(self, name: str) -> None:
        """The service is about to end by itself (a fault point): not a failure of the stack."""
        self.supervisor.release(self.child(name))

    async def wait_exit(self, name: str, timeout: float = EXIT_SECONDS) -> int:
        child = self.child(name)
        self.supervisor.release(child)
        try:
            return await asyncio.wait_for(child.proc.wait(), timeout)
        except TimeoutError:
            raise RigError(f"{name} (pid {child.pid}) did not exit within {timeout:.0f}s; "
                           f"its log {child.log_path} ends:\n{tail(child.log_path)}") from None

    async def restart(self, name: str, *, faults: str = "", wait: bool = True,
                      timeout: float = RESTART_READY_SECONDS,
                      extra: Mapping[str, str] | None = None) -> Child:
        """Start `name` again (stopping the old process if it still runs) with PK_FAULTS=faults.

        With faults the new process is expected to end at one, so its end is not a failure of
        the stack, and the wait is for it to answer or to have ended already.
        """
        if self.alive(name):
            await self.kill(name, signal.SIGTERM)
        env = {**self.stack.envs[name], **(extra or {})}  # `extra`: e.g. another PK_MODE
        env.pop("PK_FAULTS", None)
        if faults:
            env["PK_FAULTS"] = faults
        log = self.layout.log(name)
        offset = log.stat().st_size if log.exists() else 0
        child = await start_service(self.layout, self.supervisor, name, env)
        if faults:
            self.supervisor.release(child)
        if wait:
            await self.supervisor.guard(self._ready_or_ended(child, log, offset),
                                        timeout=timeout,
                                        what=f"{name} answering after its restart", log=log)
        return child

    async def _ready_or_ended(self, child: Child, log: Path, offset: int) -> None:
        ready = asyncio.ensure_future(self._ready(child.name, log, offset))
        ended = asyncio.ensure_future(child.proc.wait())
        try:
            await asyncio.wait({ready, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (ready, ended):
                task.cancel()
            await asyncio.gather(ready, ended, return_exceptions=True)
        if child.status is not None and child.pid not in self.supervisor.released:
            raise RigError(f"{child.name} exited with status {child.status} after its restart; "
                           f"its log {log} ends:\n{tail(log)}")

    async def _ready(self, name: str, log: Path, offset: int) -> None:
        if name != "gc":
            await service_ready(self.stack.nc, name)
            return
        attempt = 0
        while GC_READY_LINE not in _read_from(log, offset):
            attempt += 1
            await asyncio.sleep(min(0.05 * attempt, 0.5))  # re-read the log until the deadline

    @contextlib.asynccontextmanager
    async def reviving(self, names: Sequence[str] = SERVICES) -> AsyncIterator[list[str]]:
        """Meanwhile, a service that dies unasked is started again, as Kubernetes restarts a
        container; yields the list of such deaths (name and status), which grows."""
        deaths: list[str] = []
        task = asyncio.create_task(self._revive(names, deaths), name="rig reviver")
        try:
            yield deaths
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _revive(self, names: Sequence[str], deaths: list[str]) -> None:
        while True:
            for name in names:
                child = self.child(name)
                if child.status is not None and child.pid not in self.supervisor.released:
                    deaths.append(f"{name} exited with status {child.status}")
                    self.supervisor.release(child)
                    await self.restart(name, wait=False)
            await asyncio.sleep(REVIVE_SECONDS)  # a supervisor's round, not a test's wait

    async def restart_nats(self, index: int = 0) -> None:
        """Stop one nats-server and start it again on the same port with the same store."""
        await asyncio.to_thread(self.servers[index].restart)

    async def stop_nats(self, index: int) -> None:
        await asyncio.to_thread(self.servers[index].stop)


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read()
    except OSError:
        return b""


@contextlib.asynccontextmanager
async def open_rig(
    *,
    servers: Sequence[NatsServer] | None = None,
    overrides: Mapping[str, Mapping[str, str]] | None = None,
    credentials: tuple[str, str] | None = None,
    users: EmbeddedUsers | None = None,
    workdir: Path | None = None,
    mode: str = "deviceplugin",
) -> AsyncIterator[Rig]:
    """The whole stack on `servers` (default: one new nats-server with a user per role, as
    `partkeeper up` runs it); everything stopped after. `users` are the logins on `servers`.

    The working directory is a new short one under /tmp (unix socket paths are short) unless
    given; it is removed afterwards unless given.
    """
    root = workdir or Path(tempfile.mkdtemp(prefix="pkrl", dir="/tmp"))
    layout = Layout(root)
    layout.create()
    own = servers is None
    if own:
        users = EmbeddedUsers.made()
        conf = users.write_config(layout.root / "nats.conf", NODE)
        started = [NatsServer(str(layout.nats_dir), config=str(conf))]
    else:
        started = list(servers or ())
    supervisor = Supervisor(layout.pids_file, grace=5.0)
    failed = True
    try:
        if own:
            await asyncio.to_thread(started[0].start)
        url = ",".join(s.url for s in started)
        stack = await launch(layout, supervisor, nats_url=url, overrides=overrides,
                             credentials=credentials, users=users, mode=mode)
        try:
            yield Rig(stack, supervisor, started)
            _no_permission_refused(layout)
            failed = False
        finally:
            with contextlib.suppress(Exception):
                await stack.nc.close()
    finally:
        await supervisor.stop()
        if own:
            await asyncio.to_thread(started[0].stop)
        # A failed run keeps its logs for whoever reads the failure (the path is in the message).
        if workdir is None and not failed:
            shutil.rmtree(root, ignore_errors=True)


def _no_permission_refused(layout: Layout) -> None:
    """Every service ran inside its NATS user's grants (bus/permissions.py): the server's
    refusals reach the client as `permissions violation` errors, which the services log.

    Not counted: a reply refused on an inbox. Responders publish replies only on the inboxes
    their role grants (bus/permissions.py `_answers`); a micro discovery request (`$SRV.PING`)
    from a tool without the operators' inbox prefix is answered by nats-py's micro framework
    and refused by the server, which is the grant working, not the service failing."""
    for name in SERVICES:
        log = layout.log(name)
        if not log.exists():
            continue
        refused = [line for line in log.read_bytes().lower().splitlines()
                   if b"permissions violation" in line
                   and b'permissions violation for publish to \\"_inbox.' not in line]
        if refused:
            raise RigError(f"the NATS server refused {name} something its work needs; see "
                           f"{log}:\n{refused[0].decode(errors='replace')}")


async def reconnected(rig: Rig) -> None:
    """The rig's own connection is up again (after a NATS restart)."""
    attempt = 0
    while not rig.stack.nc.is_connected:
        attempt += 1
        await asyncio.sleep(min(0.05 * attempt, 0.5))  # re-check until the caller's deadline

