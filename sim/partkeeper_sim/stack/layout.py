"""Where `partkeeper up` keeps everything: one working directory, laid out the same every time.

    DIR/nats/                 the nats-server's JetStream store
    DIR/sim.json, kubeconfig  the simulated cards and API server access (written by the cluster)
    DIR/kubelet/              kubelet root: device-plugins/kubelet.sock, pod-resources/kubelet.sock
    DIR/pods/                 per-Pod working directories (PK_PODS_DIR)
    DIR/logs/<name>.log       each child process's output
    DIR/pids.json             the supervisor's pid and its children's, while they run
    DIR/env                   the variables a shell needs to reach the stack (`. DIR/env`)
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partkeeper_sim.cluster import Below, ClusterPaths

PODS_DIR_MODE = 0o750


@dataclass(frozen=True, slots=True)
class Layout:
    root: Path

    nats_dir = Below("root", "nats")
    logs_dir = Below("root", "logs")
    pods_dir = Below("root", "pods")
    pids_file = Below("root", "pids.json")
    env_file = Below("root", "env")

    @classmethod
    def choose(cls, workdir: str | None) -> Layout:
        """The given directory, or a fresh temporary one (kept afterwards: it holds the logs)."""
        root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="partkeeper-up-"))
        return cls(root.absolute())

    @property
    def cluster(self) -> ClusterPaths:
        return ClusterPaths(self.root, self.root / "kubelet")

    def log(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"

    def create(self) -> None:
        """Make the directories; raises ClusterError when socket paths would be too long."""
        self.cluster.check()
        for path in (self.root, self.nats_dir, self.logs_dir):
            path.mkdir(parents=True, exist_ok=True)
        # As the services would make it (partkeeper.workdir.DIR_MODE), whatever the umask.
        self.pods_dir.mkdir(mode=PODS_DIR_MODE, exist_ok=True)
        self.pods_dir.chmod(PODS_DIR_MODE)


def write_json(path: Path, content: Any) -> None:
    """Atomically, so a reader (a test, another shell) never sees half a file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(content, out, indent=2)
            out.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_env(path: Path, variables: dict[str, str], *, path_first: Path | None = None) -> None:
    """The file another shell sources (`. DIR/env`); `path_first`, the directory of the running
    `partkeeper` command, goes first on PATH, so that `partkeeper status` there is this one
    whether or not its virtual environment is active."""
    lines = [f"export {name}={_quote(value)}" for name, value in variables.items()]
    if path_first is not None:
        lines.append(f'export PATH={_quote(str(path_first))}:"$PATH"')
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)  # it carries the embedded server's admin password


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"
