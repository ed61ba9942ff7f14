"""The T-Head and Hygon installations (deploy/overlays/thead, deploy/overlays/hygon): what each
driver reads on the host reaches the containers that call it, at the path the driver names in an
Allocate reply, and nothing of NVIDIA's container toolkit is left.

The host paths come from the driver modules (thead.api, thead.nodes, hygon.api, hygon.host), so a
path the code starts to read fails here until the manifests give it.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from partkeeper import config
from partkeeper.drivers.hygon import api as dmi_api
from partkeeper.drivers.hygon import host as hygon_host
from partkeeper.drivers.thead import api as hgml_api
from partkeeper.drivers.thead import nodes as thead_nodes
from tests_support.manifests import (
    DEPLOY,
    ROOT,
    SERVICES,
    containers,
    env,
    host_paths,
    mounts,
    one,
    pod,
    render,
    validate,
    with_components,
)

VENDORS = {"thead": "hgml", "hygon": "dmi"}  # overlay and component name -> PK_DRIVER
# What a privileged container has of the host's own: its device nodes (as they are when the
# container starts), procfs and sysfs, unmasked.
KERNEL_VIEWS = ("/dev", "/proc", "/sys")


def _callers() -> set[str]:
    """The services that open the driver, from their source."""
    return {p.relative_to(ROOT / "services").parts[0]
            for p in (ROOT / "services").rglob("*.py") if "open_driver" in p.read_text()}


CALLERS = sorted(_callers())


@pytest.fixture(scope="module", params=sorted(VENDORS))
def vendor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def docs(vendor: str) -> list[dict[str, Any]]:
    return render(DEPLOY / "overlays" / vendor)


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(DEPLOY)


def _covering(docs: list[dict[str, Any]], name: str, path: str) -> dict[str, Any] | None:
    """The innermost volume mounted over `path` in container `name`, if any."""
    over = [m for at, m in mounts(docs, name).items() if PurePosixPath(path).is_relative_to(at)]
    return max(over, key=lambda m: len(m["mount"]["mountPath"]), default=None)


def _reaches(docs: list[dict[str, Any]], name: str, path: str) -> bool:
    """Whether the host's `path` is at `path` in container `name`: under a mount of the same host
    path, or in the host's /dev, /proc or /sys that a privileged container sees."""
    mount = _covering(docs, name, path)
    if mount is not None:
        return bool(mount.get("hostPath", {}).get("path") == mount["mount"]["mountPath"])
    privileged = containers(docs)[name]["securityContext"].get("privileged") is True
    return privileged and any(PurePosixPath(path).is_relative_to(v) for v in KERNEL_VIEWS)


def _read_only(docs: list[dict[str, Any]], name: str, path: str) -> bool:
    mount = _covering(docs, name, path)
    return mount is not None and mount["mount"].get("readOnly") is True


def _settings(docs: list[dict[str, Any]]) -> config.Config:
    return config.load(one(docs, "ConfigMap")["data"])


def test_the_overlay_selects_its_driver_and_its_nodes(docs: list[dict[str, Any]],
                                                      vendor: str) -> None:
    validate(docs)
    settings = _settings(docs)
    assert settings.driver == VENDORS[vendor]
    # host paths in an Allocate reply are the agent's own paths
    assert (settings.driver_root, settings.proc_root) == (Path("/"), Path("/proc"))
    assert settings.resource_prefix == config.RESOURCE_NAMES[VENDORS[vendor]][0]
    assert pod(docs)["nodeSelector"] == {"partkeeper.io/driver": VENDORS[vendor]}


NVIDIA_CAPS = "/dev/nvidia-caps"  # the base's, for the NVIDIA allocator's capability nodes


def test_nothing_of_the_nvidia_toolkit_is_left(docs: list[dict[str, Any]]) -> None:
    spec = pod(docs)
    assert "runtimeClassName" not in spec
    assert not [k for k in spec["nodeSelector"] if k.startswith("nvidia.com/")]
    assert not [t for t in spec.get("tolerations", []) if t["key"].startswith("nvidia.com/")]
    for name, c in containers(docs).items():
        assert not [v for v in env(c) if v.startswith("NVIDIA_")], name
        assert NVIDIA_CAPS not in host_paths(docs, name)  # no MIG capability nodes here


def test_only_the_driver_callers_get_privilege_and_vendor_paths(
        docs: list[dict[str, Any]], base: list[dict[str, Any]]) -> None:
    assert [c["name"] for c in pod(docs)["containers"]] == list(SERVICES)
    assert set(CALLERS) < set(SERVICES) and CALLERS  # a derivation finding none proves nothing
    for name in SERVICES:
        sc = containers(docs)[name]["securityContext"]
        if name in CALLERS:
            # the vendor's device nodes are opened by its library, and no runtime hook lets a
            # container's device cgroup open them otherwise
            assert sc["privileged"] is True and sc["runAsUser"] == 0
            assert host_paths(docs, name) > host_paths(base, name) - {NVIDIA_CAPS}
        else:
            assert sc == containers(base)[name]["securityContext"]
            assert host_paths(docs, name) == host_paths(base, name)


def _thead_paths(container: dict[str, Any]) -> list[str]:
    library = [p for p in hgml_api.candidates(env(container)) if p.startswith("/")]
    nodes = [*thead_nodes.CONTROL_NODES, f"{thead_nodes.PPU_NODE}0",
             f"{thead_nodes.CAPS_DIR}/alixpu-cap1"]
    return [*library, *nodes, thead_nodes.capability_record(0, 1, 0)]


def _hygon_paths() -> list[str]:
    library = [p for p in dmi_api.candidates() if p.startswith("/")]
    nodes = [*hygon_host.CONTROL_NODES, f"{hygon_host.DRI_DIR}/card0",
             f"{hygon_host.DRI_DIR}/renderD128"]
    sysfs = [f"{hygon_host.PCI_DEVICES}/0000:09:00.0/{leaf}" for leaf in ("unique_id", "drm")]
    registry = [f"{hygon_host.REGISTRY}/dev0", hygon_host.conf_record(0, 1, 0)]
    return [*library, hygon_host.HYHAL, *nodes, *sysfs, *registry]


def test_every_host_path_the_thead_driver_reads_is_there() -> None:
    docs = render(DEPLOY / "overlays" / "thead")
    for name in CALLERS:
        c = containers(docs)[name]
        for path in _thead_paths(c):
            assert _reaches(docs, name, path), (name, path)
        # the library is where the driver looks whatever the host's PPU_HOME, read-only
        assert env(c)["PPU_HOME"] == hgml_api.PPU_HOME
        for path in [p for p in hgml_api.candidates({}) if p.startswith("/")]:
            assert _read_only(docs, name, path), (name, path)
        for directory in env(c)["LD_LIBRARY_PATH"].split(":"):
            assert _reaches(docs, name, directory) and _read_only(docs, name, directory)
        # the capability nodes appear with each instance, after the container started: a
        # mount, not the runtime's copy of /dev
        caps = _covering(docs, name, thead_nodes.CAPS_DIR)
        assert caps is not None and caps["mount"].get("readOnly") is True
        assert caps["hostPath"]["path"] == thead_nodes.CAPS_DIR


def test_every_host_path_the_hygon_driver_reads_is_there() -> None:
    docs = render(DEPLOY / "overlays" / "hygon")
    for name in CALLERS:
        for path in _hygon_paths():
            assert _reaches(docs, name, path), (name, path)
        for path in [p for p in dmi_api.candidates() if p.startswith("/")] + [hygon_host.HYHAL]:
            assert _read_only(docs, name, path), (name, path)
        # the library writes the records inside its create and destroy calls; the reclaimer
        # removes directories squatting at record paths
        registry = _covering(docs, name, hygon_host.REGISTRY)
        assert registry is not None and registry["hostPath"]["path"] == hygon_host.REGISTRY
        assert not registry["mount"].get("readOnly")
        assert registry["hostPath"]["type"] == "Directory"  # never made empty by kubelet


@pytest.mark.parametrize("extra", ["cdi", "dra"])
def test_the_vendor_components_compose_with_cdi_and_dra(vendor: str, extra: str,
                                                        tmp_path: Path) -> None:
    docs = render(with_components(tmp_path, vendor, extra))
    validate(docs)
    alone = render(DEPLOY / "overlays" / vendor)
    assert _settings(docs).driver == VENDORS[vendor]
    for name in CALLERS:
        assert host_paths(docs, name) >= host_paths(alone, name) | {"/var/run/cdi"}
        assert containers(docs)[name]["securityContext"]["privileged"] is True
