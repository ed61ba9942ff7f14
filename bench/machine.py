"""What the report says about where it was measured: the machine, the software, the code.

Only facts that explain a figure: CPU model and cores, memory, Python, OS and kernel, the load
when the run began, and the commit measured. Read-only throughout; git is asked with
`--no-optional-locks` so that even `status` writes nothing into the repository.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

GIT_SECONDS = 10.0


def _first_value(path: str, key: str, sep: str = ":") -> str | None:
    """The value of the first `key<sep>value` line of a /proc or /etc file."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, found, value = line.partition(sep)
        if found and name.strip() == key:
            return value.strip().strip('"')
    return None


def cpu_model() -> str:
    return _first_value("/proc/cpuinfo", "model name") or platform.processor() or "unknown"


def cores() -> str:
    total = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    return str(total) if usable == total else f"{usable} usable of {total}"


def memory() -> str:
    raw = _first_value("/proc/meminfo", "MemTotal")  # "24683900 kB"
    if not raw or not raw.split()[0].isdigit():
        return "unknown"
    return f"{int(raw.split()[0]) / 1024 / 1024:.1f} GiB"


def operating_system() -> str:
    name = _first_value("/etc/os-release", "PRETTY_NAME", "=") or platform.system()
    return f"{name}, {platform.system()} {platform.release()} {platform.machine()}"


def python() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}"


def commit(root: Path) -> str:
    """The commit measured, and whether the working tree differed from it."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "--no-optional-locks", *args], cwd=root,
                              capture_output=True, text=True, timeout=GIT_SECONDS, check=True)
        return done.stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"{head} with uncommitted changes" if dirty else head


def describe(root: Path) -> dict[str, str]:
    return {
        "CPU": cpu_model(),
        "cores": cores(),
        "memory": memory(),
        "Python": python(),
        "OS": operating_system(),
        "load average (1, 5, 15 min) at start": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        "code": commit(root),
    }
