"""Running `partkeeper up` and `partkeeper sim cluster` as processes, and checking none survives."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests_support import short_tmpdir

READY_DEADLINE = 120.0  # the whole stack on two busy cores
STOP_DEADLINE = 60.0
DEMO_DEADLINE = 180.0
READY_LINE = "partkeeper up: ready"


def short_workdir() -> contextlib.AbstractContextManager[Path]:
    """A temp dir short enough for the kubelet's unix sockets."""
    return short_tmpdir("pkst")


def partkeeper(*args: str) -> list[str]:
    return [sys.executable, "-m", "partkeeper", *args]


def run_cli(args: Sequence[str], env: Mapping[str, str] | None = None) -> Any:
    """`partkeeper <args> --json`'s output, parsed; fails the test with stderr otherwise."""
    done = subprocess.run(partkeeper(*args), capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, check=False)
    assert done.returncode == 0, f"partkeeper {' '.join(args)} failed: {done.stderr}"
    return json.loads(done.stdout)


class Up:
    """`partkeeper up --workdir DIR` in the background, its output read line by line."""

    def __init__(self, workdir: Path, env: Mapping[str, str] | None = None,
                 args: Sequence[str] = ()) -> None:
        self.workdir = workdir
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            partkeeper("up", "--workdir", str(workdir), *args), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})},
        )

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, prefix: str, deadline: float) -> None:
        """Read output until a line starts with `prefix`; fails on exit or expiry."""
        assert self.proc.stdout is not None
        end = time.monotonic() + deadline
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < end:
                if not selector.select(timeout=end - time.monotonic()):
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    raise AssertionError(f"partkeeper up exited early:\n{self.output()}")
                self.lines.append(line.rstrip("\n"))
                if line.startswith(prefix):
                    return
        raise AssertionError(f"no line {prefix!r} after {deadline:.0f}s:\n{self.output()}")

    def terminate(self) -> int:
        """SIGTERM, then its exit status once it has stopped everything."""
        self.proc.send_signal(signal.SIGTERM)
        rest, _ = self.proc.communicate(timeout=STOP_DEADLINE)
        self.lines += rest.splitlines()
        return self.proc.returncode

    def kill(self) -> None:
        """For test teardown after a failure: never leave `up` running."""
        if self.proc.poll() is None:
            self.terminate()

    def env(self) -> dict[str, str]:
        """The variables `up` wrote to DIR/env for other shells."""
        found = {}
        for line in (self.workdir / "env").read_text().splitlines():
            [assignment] = shlex.split(line.removeprefix("export "))
            name, _, value = assignment.partition("=")
            found[name] = os.path.expandvars(value)  # PATH's line keeps "$PATH" for the shell
        return found


@contextlib.contextmanager
def up_ready(*args: str) -> Iterator[Up]:
    """`partkeeper up [args]` in a fresh workdir, once it says it is ready; stopped after."""
    with short_workdir() as workdir:
        running = Up(workdir, args=args)
        try:
            running.wait_for_line(READY_LINE, READY_DEADLINE)
            yield running
        finally:
            running.kill()


def recorded_children(workdir: Path) -> dict[str, dict[str, Any]]:
    children: dict[str, dict[str, Any]] = json.loads((workdir / "pids.json").read_text())[
        "children"
    ]
    return children


def survivors(groups: Sequence[int]) -> list[str]:
    """Live processes (zombies do not count) whose process group is one of `groups`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        # The command may hold spaces and parentheses: the fields follow the last ')'.
        fields = stat.rsplit(")", 1)[1].split()
        state, pgid = fields[0], int(fields[2])
        if pgid in groups and state != "Z":
            found.append(stat)
    return found


def wait_no_survivors(groups: Sequence[int], deadline: float = 10.0) -> list[str]:
    """Survivors once a SIGKILL had time to land (delivery is asynchronous), bounded."""
    end = time.monotonic() + deadline
    left = survivors(groups)
    while left and time.monotonic() < end:
        time.sleep(0.05)  # poll interval of a condition bounded by the deadline
        left = survivors(groups)
    return left
