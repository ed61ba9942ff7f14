"""Device handoff as NVIDIA's device plugin does it, against the fake NVML's proc tree and a fake
dev tree: device specs for the card and the MIG capability nodes, and CDI specs."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Literal

import pytest
from fakes.hostfs import char_device
from fakes.nvml import CAPS_MAJOR, FakeNvml

from partkeeper import cdi
from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.devices import DeviceNode, DeviceNodeError, Roots, partition_nodes
from partkeeper.drivers import Driver, open_driver
from partkeeper.drivers.base import ContainerEdits, InstanceSpec, ReadError
from partkeeper.drivers.nvidia.binding import NvmlDriver
from services.allocator.core import handoff
from services.allocator.core.refusal import Refusal
from services.allocator.core.state import Context
from services.allocator.deviceplugin import plugin
from tests_support.drivers import active_claim


def _minor(path: Path) -> int:
    return int(path.read_text().split("DeviceFileMinor:")[1].split()[0])


@pytest.fixture
def mknod_allowed(tmp_path: Path) -> None:
    """Skips where this process may not make device nodes (no CAP_MKNOD): the refusal tests
    below still run there, through the driver's seam."""
    if not char_device(tmp_path / "probe-node", 1, 3):
        pytest.skip("no CAP_MKNOD here: capability nodes cannot be made")
    (tmp_path / "probe-node").unlink()


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    dev = tmp_path / "driver" / "dev"
    dev.mkdir(parents=True)
    (dev / "nvidiactl").touch()
    (dev / "nvidia-uvm").touch()  # no uvm-tools, no modeset: they are left out
    return Roots(driver_root=tmp_path / "driver", proc_root=tmp_path / "proc")


def _nvml(roots: Roots) -> Driver:
    """The nvml driver as the services open it: its roots from PK_DRIVER_ROOT and PK_PROC_ROOT."""
    driver = open_driver(Config(driver="nvml", driver_root=roots.driver_root,
                                proc_root=roots.proc_root))
    assert isinstance(driver, NvmlDriver)
    return driver


def test_nodes_name_the_card_and_the_capabilities_the_driver_published(
    no_complaints: FakeNvml, roots: Roots, mknod_allowed: None
) -> None:
    driver = _nvml(roots)
    driver.create(InstanceSpec(1, "1g.5gb", 0))  # GI 7 on card 1
    inst = driver.create(InstanceSpec(1, "3g.20gb", 4))
    card = driver.cards()[1]
    assert card.minor == 1
    caps = roots.proc_root / "driver/nvidia/capabilities/gpu1/mig" / f"gi{inst.gi_id}"
    gi_minor, ci_minor = _minor(caps / "access"), _minor(caps / f"ci{inst.ci_id}" / "access")
    edits = driver.container_edits([inst])
    host = roots.driver_root
    assert list(edits.devices) == [
        DeviceNode("/dev/nvidiactl", str(host / "dev/nvidiactl"), major=195, minor=255),
        DeviceNode("/dev/nvidia-uvm", str(host / "dev/nvidia-uvm"), major=236, minor=0),
        DeviceNode("/dev/nvidia1", str(host / "dev/nvidia1"), major=195, minor=1),
        DeviceNode(f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
                   str(host / f"dev/nvidia-caps/nvidia-cap{gi_minor}"), major=CAPS_MAJOR,
                   minor=gi_minor),
        DeviceNode(f"/dev/nvidia-caps/nvidia-cap{ci_minor}",
                   str(host / f"dev/nvidia-caps/nvidia-cap{ci_minor}"), major=CAPS_MAJOR,
                   minor=ci_minor),
    ]
    assert edits.env == {"NVIDIA_VISIBLE_DEVICES": inst.uuid} and edits.mounts == ()
    driver.destroy(inst)
    with pytest.raises(ReadError, match=f"cannot be handed over: .*gi{inst.gi_id}/access"):
        driver.container_edits([inst])  # gone with the instance


def _char(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode), f"{path} is no character device"
    return os.major(st.st_rdev), os.minor(st.st_rdev), stat.S_IMODE(st.st_mode)


def test_capability_nodes_are_made_as_nvidia_modprobe_makes_them(
    no_complaints: FakeNvml, roots: Roots, mknod_allowed: None
) -> None:
    """The kernel publishes the capability files, nothing makes the nodes: the reply's host paths
    exist before it is sent, with the file's minor and mode and the nvidia-caps major (not the
    nvidia-caps-imex-channels one listed before it), and a wrong node there is made again."""
    driver = _nvml(roots)
    inst = driver.create(InstanceSpec(0, "7g.80gb", 0))  # the full card: GI 0
    assert inst.gi_id == 0
    caps = roots.proc_root / "driver/nvidia/capabilities/gpu0/mig/gi0"
    gi_minor, ci_minor = _minor(caps / "access"), _minor(caps / "ci0/access")
    dev = roots.driver_root / "dev/nvidia-caps"
    assert not dev.exists()
    (roots.driver_root / "dev/nvidia-caps").mkdir()
    (dev / f"nvidia-cap{ci_minor}").write_text("not a node")  # a stale file: replaced
    edits = driver.container_edits([inst])
    for minor in (gi_minor, ci_minor):
        assert _char(dev / f"nvidia-cap{minor}") == (CAPS_MAJOR, minor, 0o444)  # DeviceFileMode 292
    assert {d.host_path for d in edits.devices} >= {str(dev / f"nvidia-cap{gi_minor}")}
    assert driver.container_edits([inst]) == edits  # a second reply finds them made


async def test_a_node_that_cannot_be_made_refuses_naming_it(
    no_complaints: FakeNvml, roots: Roots, tmp_path: Path, js, node: str
) -> None:
    """Without CAP_MKNOD (the seam stands in for the kernel's EPERM) the Allocate is refused with
    a sentence naming the node, its numbers and why; no CDI spec names it."""
    def refused(path: str, mode: int, device: int) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)

    driver = NvmlDriver(root=roots.driver_root, proc_root=roots.proc_root, make_node=refused)
    inst = driver.create(InstanceSpec(0, "1g.10gb", 0))
    minor = _minor(roots.proc_root / f"driver/nvidia/capabilities/gpu0/mig/gi{inst.gi_id}/access")
    claim = active_claim(inst, "c0")
    config = Config(node=node, driver="nvml", device_list_strategy="cdi", cdi_dir=tmp_path / "cdi")
    with pytest.raises(Refusal) as err:
        await handoff.partition_handoff(await _context(js, node, driver, config), [claim])
    message = err.value.message
    assert (f"cannot create /dev/nvidia-caps/nvidia-cap{minor} (character device "
            f"{CAPS_MAJOR}:{minor}, mode 0444) under {roots.driver_root}: Operation not "
            "permitted; the allocator needs CAP_MKNOD") in message
    assert f"instance {inst.uuid}" in message and message.endswith("kubelet may retry")
    assert not (tmp_path / "cdi").exists()


def test_a_capability_the_driver_says_not_to_make_is_only_checked(
    no_complaints: FakeNvml, roots: Roots
) -> None:
    """DeviceFileModify: 0 (ModifyDeviceFiles off): nvidia-modprobe makes nothing, so neither
    does the driver; a missing node is refused saying so."""
    driver = _nvml(roots)
    inst = driver.create(InstanceSpec(0, "1g.10gb", 0))
    access = roots.proc_root / f"driver/nvidia/capabilities/gpu0/mig/gi{inst.gi_id}/access"
    minor = _minor(access)
    access.write_text(f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 0\n")
    with pytest.raises(ReadError) as err:
        driver.container_edits([inst])
    assert (f"/dev/nvidia-caps/nvidia-cap{minor} under {roots.driver_root} is missing, and "
            f"{access} says DeviceFileModify: 0") in str(err.value)
    assert not (roots.driver_root / f"dev/nvidia-caps/nvidia-cap{minor}").exists()


def test_without_the_caps_major_the_nodes_are_refused(
    no_complaints: FakeNvml, roots: Roots
) -> None:
    driver = _nvml(roots)
    inst = driver.create(InstanceSpec(0, "1g.10gb", 0))
    devices = roots.proc_root / "devices"
    devices.write_text("Character devices:\n195 nvidia-frontend\n234 nvidia-caps-imex-channels\n"
                       "\nBlock devices:\n235 nvidia-caps\n")  # only a block device of that name
    with pytest.raises(ReadError, match=f"{devices} lists no nvidia-caps character device"):
        driver.container_edits([inst])
    assert not (roots.driver_root / "dev/nvidia-caps").exists()


def test_whole_cards_get_the_control_nodes_once_and_each_card_node(
    no_complaints: FakeNvml, roots: Roots
) -> None:
    driver = _nvml(roots)
    cards = driver.cards()
    edits = driver.card_edits([cards[1], cards[3]])  # card 3 is the sliced A100
    host = roots.driver_root
    assert [(d.container_path, d.host_path) for d in edits.devices] == [
        (p, str(host / p.lstrip("/")))
        for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1", "/dev/nvidia3")
    ]
    assert edits.env == {"NVIDIA_VISIBLE_DEVICES": f"{cards[1].uuid},{cards[3].uuid}"}


def test_a_capability_file_without_a_minor_is_an_error(tmp_path: Path) -> None:
    roots = Roots(tmp_path, tmp_path / "proc")
    access = tmp_path / "proc/driver/nvidia/capabilities/gpu0/mig/gi3/access"
    access.parent.mkdir(parents=True)
    access.write_text("DeviceFileMode: 292\n")
    with pytest.raises(DeviceNodeError, match="names no DeviceFileMinor"):
        partition_nodes(roots, 0, 3, 0)


def test_the_cdi_spec_is_version_0_6_with_the_uuid_and_the_nodes(tmp_path: Path) -> None:
    nodes = [DeviceNode("/dev/nvidia0", "/host/dev/nvidia0")]
    edits = ContainerEdits(env={"NVIDIA_VISIBLE_DEVICES": "MIG-1234"}, devices=tuple(nodes))
    spec = cdi.spec_for("c0ffee01", "MIG-1234", edits, {"PK_POD_UID": "u"})
    path = cdi.write_spec(tmp_path / "cdi", "c0ffee01", spec)
    written = json.loads(path.read_text())
    assert tuple(int(x) for x in written["cdiVersion"].split(".")) >= (0, 6, 0)
    assert written["kind"] == "partkeeper.io/partition"
    [device] = written["devices"]
    assert device["name"] == "c0ffee01"
    assert device["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=MIG-1234", "PK_POD_UID=u"]
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": "/host/dev/nvidia0", "permissions": "rw"}
    ]
    assert cdi.qualified("c0ffee01") == "partkeeper.io/partition=c0ffee01"
    assert cdi.remove_spec(tmp_path / "cdi", "c0ffee01") is True
    assert cdi.remove_spec(tmp_path / "cdi", "c0ffee01") is False
    with pytest.raises(cdi.CdiError):
        cdi.spec_path(tmp_path, "../escape")


async def _context(js, node: str, driver: Driver, config: Config) -> Context:
    store = ClaimsStore(await Bucket.open(js, "pk-claims"), node)
    return Context(config, js._nc, js, store, driver, tuple(driver.cards()),
                   {}, None, None)  # type: ignore[arg-type]  # parts unused here


@pytest.mark.parametrize("strategy", ["envvar", "cdi"])
async def test_allocate_response_carries_device_specs_and_cdi_devices(
    no_complaints: FakeNvml, roots: Roots, tmp_path: Path, js, node: str,
    strategy: Literal["envvar", "cdi"], mknod_allowed: None,
) -> None:
    driver = _nvml(roots)
    insts = [driver.create(InstanceSpec(0, "1g.10gb", s)) for s in (0, 1)]
    claims = [active_claim(i, f"c{n}") for n, i in enumerate(insts)]
    config = Config(node=node, driver="nvml", device_list_strategy=strategy,
                    cdi_dir=tmp_path / "cdi")
    ctx = await _context(js, node, driver, config)
    nodes, names = await handoff.partition_handoff(ctx, claims)
    response = plugin.partition_response(claims, nodes, names)
    paths = [d.container_path for d in response.devices]
    assert paths.count("/dev/nvidia0") == 1 and len(paths) == 2 + 1 + 4  # ctl, uvm, card, 4 caps
    assert all(d.permissions == "rw" for d in response.devices)
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(i.uuid for i in insts)
    if strategy == "envvar":
        assert list(response.cdi_devices) == [] and not (tmp_path / "cdi").exists()
        return
    assert [d.name for d in response.cdi_devices] == [cdi.qualified("c0"), cdi.qualified("c1")]
    for claim, inst in zip(claims, insts, strict=True):
        spec = json.loads(cdi.spec_path(config.cdi_dir, claim.id).read_text())
        edits = spec["devices"][0]["containerEdits"]
        assert f"NVIDIA_VISIBLE_DEVICES={inst.uuid}" in edits["env"]
        assert len(edits["deviceNodes"]) == 5
        # every node typed and numbered: the runtime makes it without stat-ing a host node
        assert all(n["type"] == "c" and "major" in n and "minor" in n
                   for n in edits["deviceNodes"])
        caps = [n for n in edits["deviceNodes"] if "nvidia-caps" in n["path"]]
        assert [n["major"] for n in caps] == [CAPS_MAJOR] * 2
        assert [n["path"] for n in caps] == [
            f"/dev/nvidia-caps/nvidia-cap{n['minor']}" for n in caps]


async def test_a_capability_that_cannot_be_read_refuses_naming_the_partition_and_the_pod(
    no_complaints: FakeNvml, roots: Roots, tmp_path: Path, js, node: str
) -> None:
    driver = _nvml(roots)
    inst = driver.create(InstanceSpec(0, "1g.10gb", 0))
    access = roots.proc_root / "driver/nvidia/capabilities/gpu0/mig" / f"gi{inst.gi_id}/access"
    access.unlink()
    claim = active_claim(inst, "c0")
    config = Config(node=node, driver="nvml", device_list_strategy="cdi", cdi_dir=tmp_path / "cdi")
    with pytest.raises(Refusal) as refused:
        await handoff.partition_handoff(await _context(js, node, driver, config), [claim])
    message = refused.value.message
    assert f"Pod {claim.namespace}/{claim.name} ({claim.pod_uid})" in message
    assert f"instance {inst.uuid}" in message and "claim(s) c0" in message
    assert f"device nodes cannot be handed over: cannot read MIG capability {access}" in message
    assert message.endswith("kubelet may retry")
    assert not (tmp_path / "cdi").exists()  # no spec without its nodes
