"""The services' image, built by `make image` from the repository's Dockerfile and run.

It starts (`partkeeper --version`), says in one sentence what is missing on a node without NVML
(`partkeeper probe`), runs as the user and group the manifests run the watcher as, and holds no
build tools and, unless built with EXTRAS=sim, nothing of the simulator.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests_support.containers import ROOT, VERSION, image_has, podman, run_image

BUILD_TOOLS = ("/usr/bin/gcc*", "/usr/bin/cc", "/usr/bin/c++", "/usr/bin/make", "/usr/bin/ld",
               "/usr/bin/as", "/usr/include/python3*", "/usr/local/include/python3*/Python.h")
# The first test of a session waits for `make image` (about a minute here) in its fixture.
pytestmark = [pytest.mark.containers, pytest.mark.timeout(900)]
SIMULATOR = ("/usr/local/lib/python3*/site-packages/partkeeper_sim",
             "/usr/local/lib/python3*/site-packages/rich", "/usr/local/bin/nats-server")


def test_the_image_starts_and_names_its_version(slim_image: str) -> None:
    result = run_image(slim_image, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"partkeeper {VERSION}"


def test_probe_without_nvml_is_one_sentence(slim_image: str) -> None:
    result = run_image(slim_image, "probe")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("partkeeper probe: the NVIDIA management library "
                               "(libnvidia-ml.so.1) cannot be used on this node")
    assert "PK_DRIVER=sim" in lines[0]


def test_the_image_runs_as_the_user_the_manifests_expect(slim_image: str) -> None:
    daemonset = yaml.safe_load((ROOT / "deploy/base/daemonset.yaml").read_text())
    [watcher] = [c for c in daemonset["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "watcher"]
    context = watcher["securityContext"]
    config = json.loads(podman("image", "inspect", slim_image).stdout)[0]["Config"]
    assert config["User"] == f"{context['runAsUser']}:{context['runAsGroup']}"
    result = run_image(slim_image, "-c", "import os; print(os.getuid(), os.getgid())",
                       entrypoint="python")
    assert result.stdout.split() == [str(context["runAsUser"]), str(context["runAsGroup"])]


def test_the_image_holds_no_build_tools_and_no_simulator(slim_image: str) -> None:
    assert image_has(slim_image, BUILD_TOOLS) == []
    assert image_has(slim_image, SIMULATOR) == []
    result = run_image(slim_image, "up", "--demo")
    assert result.returncode == 2
    assert "pip install partkeeper-sim" in result.stderr


def test_the_simulator_is_in_the_image_built_with_it(sim_image: str) -> None:
    assert image_has(sim_image, BUILD_TOOLS) == []
    assert len(image_has(sim_image, SIMULATOR)) == len(SIMULATOR)
    result = run_image(sim_image, "sim", "--help")
    assert result.returncode == 0 and "cluster" in result.stdout
