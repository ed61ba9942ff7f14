"""Who enforces logical slices (`PK_SLICE_LIMITER`): HAMi-core's env and mounts in the reply and
the CDI spec, a refused start when its files are missing, and "unenforced" said wherever a person
looks when no limiter is configured.

The names asserted here are written out from the upstream sources, not imported from ours, so a
rename on our side fails the test: HAMi-core's README ("Usage": `CUDA_DEVICE_MEMORY_LIMIT`,
`CUDA_DEVICE_SM_LIMIT`, `/tmp/vgpulock`) and HAMi's device plugin (Project-HAMi/HAMi,
pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go `Allocate`: per device
`CUDA_DEVICE_MEMORY_LIMIT_<i>` = `<MiB>m`, `CUDA_DEVICE_SM_LIMIT`,
`CUDA_DEVICE_MEMORY_SHARED_CACHE` = `<dir>/<name>.cache`, read-only mounts
`/usr/local/vgpu/libvgpu.so` and `/etc/ld.so.preload`, read-write `/tmp/vgpulock`).
"""

from __future__ import annotations

import json
import logging
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from partkeeper import limiter
from partkeeper.config import Config
from partkeeper.drivers.base import Card
from partkeeper.errors import StartupError
from partkeeper.status import build, render
from partkeeper.workdir import sliced_dir
from partkeeper_sim.driver import SimDriver, init_state
from schemas import NodeCapacity, decode
from schemas.names import BUCKET_CAPACITY, capacity_key
from services.allocator.core import sliced as slices
from services.allocator.main import serve
from tests_support import make_claim, until
from tests_support.allocator import FAST, SLICED, node_stack
from tests_support.kubelet import pod_record

MIB_A100 = 40 * 1024  # the sim's A100-40GB


def _limiter_dir(tmp_path: Path) -> Path:
    lib = tmp_path / "vgpu"
    lib.mkdir()
    (lib / "libvgpu.so").write_bytes(b"\x7fELF")
    (lib / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    return lib


async def _capacity(js, node: str) -> NodeCapacity:
    kv = await js.key_value(BUCKET_CAPACITY)
    entry = await kv.get(capacity_key(node))
    return decode(entry.value or b"", NodeCapacity, what="capacity")


async def test_hami_core_reply_carries_its_documented_env_and_mounts(
    nc, js, node, tmp_path
) -> None:
    lib = _limiter_dir(tmp_path)
    lock = tmp_path / "vgpulock"
    settings = {"slice_limiter": "hami-core", "slice_limiter_dir": lib}
    options = replace(FAST, limiter_lock_dir=lock)
    async with node_stack(nc, node, sliced=("A100-40GB",), slices_per_card=4,
                          settings=settings, options=options) as n:
        await n.wait_healthy(SLICED, 4)
        a = await n.add_pod("a", {"main": {SLICED: 2}})
        await n.phase(a, "Running")
        response = pod_record(n.kubelet, a).containers["main"].responses[SLICED]
        env = dict(response.envs)
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{MIB_A100 * 2 // 4}m"
        assert "CUDA_DEVICE_MEMORY_LIMIT_1" not in env  # one card, one device
        assert env["CUDA_DEVICE_SM_LIMIT"] == "50"
        mounts = {m.container_path: (m.host_path, m.read_only) for m in response.mounts}
        assert mounts["/usr/local/vgpu/libvgpu.so"] == (str(lib / "libvgpu.so"), True)
        assert mounts["/etc/ld.so.preload"] == (str(lib / "ld.so.preload"), True)
        assert mounts["/tmp/vgpulock"] == (str(lock), False)
        assert stat.S_IMODE(lock.stat().st_mode) == 0o1777  # non-root containers can lock
        # The shared cache file sits in a read-write mount of the Pod's working directory.
        cache = env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
        assert cache.endswith(".cache")
        parent, _, _ = cache.rpartition("/")
        host_cache, read_only = mounts[parent]
        host = sliced_dir(n.config.pods_dir, a, "main")
        assert (Path(host_cache), read_only) == (host / "cache", False)
        # Any container user can create the cache file (HAMi makes its cache dir 0777).
        assert stat.S_IMODE((host / "cache").stat().st_mode) == 0o777
        assert env["PK_SLICE_LIMITER"] == "hami-core" and env["PK_SLICE_ENFORCED"] == "true"
        limits = json.loads((host / "limits.json").read_bytes())
        assert (limits["limiter"], limits["enforced"]) == ("hami-core", True)

        async def reported() -> bool:
            view = (await _capacity(js, node)).slice_limiter
            return view is not None and view.enforced and view.name == "hami-core"

        await until(reported, "the capacity document says the slices are enforced")
        assert REGISTRY.get_sample_value(
            "partkeeper_slice_limiter_info", {"limiter": "hami-core", "enforced": "true"}) == 1
        await until(lambda: REGISTRY.get_sample_value(  # the pass after the activation
            "partkeeper_claimed_instances", {"profile": "sliced", "state": "active"}) == 2,
            "the claims gauge counts the two active slices")


async def test_hami_core_cdi_spec_carries_the_same_edits(nc, js, node, tmp_path) -> None:
    lib = _limiter_dir(tmp_path)
    cdi_dir = tmp_path / "cdi"
    settings = {"slice_limiter": "hami-core", "slice_limiter_dir": lib,
                "device_list_strategy": "cdi", "cdi_dir": cdi_dir}
    options = replace(FAST, limiter_lock_dir=tmp_path / "vgpulock")
    async with node_stack(nc, node, sliced=("A100-40GB",), settings=settings,
                          options=options, real_reclaimer=True) as n:
        a = await n.add_pod("a", {"main": {SLICED: 1}})
        await n.phase(a, "Running")
        response = pod_record(n.kubelet, a).containers["main"].responses[SLICED]
        [claim] = await n.claims_of(a)
        assert [d.name for d in response.cdi_devices] == [f"partkeeper.io/partition={claim.id}"]
        [spec_file] = cdi_dir.iterdir()
        edits = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]
        env = dict(e.split("=", 1) for e in edits["env"])
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{MIB_A100 // 4}m"
        assert env["CUDA_DEVICE_SM_LIMIT"] == "25"
        assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == response.envs[
            "CUDA_DEVICE_MEMORY_SHARED_CACHE"]
        ro = {m["containerPath"]: m["hostPath"] for m in edits["mounts"] if "ro" in m["options"]}
        assert ro["/usr/local/vgpu/libvgpu.so"] == str(lib / "libvgpu.so")
        assert ro["/etc/ld.so.preload"] == str(lib / "ld.so.preload")
        await n.watcher.gone(a)  # the reclaimer removes the spec with the claim
        await until(lambda: not any(cdi_dir.iterdir()), "the slice's CDI spec is removed")


@pytest.mark.parametrize("absent", ["libvgpu.so", "ld.so.preload", "both"])
async def test_missing_limiter_files_refuse_the_start(nc, node, tmp_path, absent) -> None:
    lib = _limiter_dir(tmp_path)
    for name in ("libvgpu.so", "ld.so.preload"):
        if absent in (name, "both"):
            (lib / name).unlink()
    state = tmp_path / "sim.json"
    init_state(state, ["H100-80GB"], ["A100-40GB"])
    config = Config(node=node, slice_limiter="hami-core", slice_limiter_dir=lib, driver="sim",
                    sim_state=state, kubelet_dir=tmp_path / "dp", pods_dir=tmp_path / "pods")
    options = replace(FAST, limiter_lock_dir=tmp_path / "lock", driver=SimDriver(state))
    with pytest.raises(StartupError) as caught:
        await serve(config, nc, options=options)
    message = str(caught.value)
    assert "\n" not in message and message.count(". ") == 0  # one sentence
    for name in ("libvgpu.so", "ld.so.preload"):
        assert (str(lib / name) in message) == (absent in (name, "both"))
    assert "PK_SLICE_LIMITER=hami-core" in message
    assert not (tmp_path / "lock").exists() and not (tmp_path / "dp").exists()  # nothing done


async def test_without_a_limiter_slices_are_reported_unenforced(
    nc, js, node, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="services.allocator.core.sliced")
    async with node_stack(nc, node, sliced=("A100-40GB",)) as n:
        a = await n.add_pod("a", {"main": {SLICED: 1}})
        await n.phase(a, "Running")
        response = pod_record(n.kubelet, a).containers["main"].responses[SLICED]
        assert not any(k.startswith("CUDA_DEVICE_") for k in response.envs)
        assert response.envs["PK_SLICE_ENFORCED"] == "false"
        assert "/etc/ld.so.preload" not in {m.container_path for m in response.mounts}
        [line] = [r for r in caplog.records if r.name == "services.allocator.core.sliced"]
        assert "UNENFORCED" in line.getMessage() and line.slices_enforced is False
        capacity = await _capacity(js, node)
        assert capacity.slice_limiter is not None
        assert (capacity.slice_limiter.name, capacity.slice_limiter.enforced) == ("none", False)
        status = build(node, capacity, {}, {"pk-allocator": True})
        assert status["slice_limiter"] == {"name": "none", "enforced": False, "dir": "",
                                           "missing": []}
        text = render(status)
        assert "slices NOT enforced" in text


def test_probe_reports_whether_the_limiter_files_are_present(tmp_path) -> None:
    lib = _limiter_dir(tmp_path)
    config = Config(slice_limiter="hami-core", slice_limiter_dir=lib)
    found = limiter.report(config)
    assert found["enforced"] is True
    assert found["files"] == {str(lib / "libvgpu.so"): True, str(lib / "ld.so.preload"): True}
    (lib / "ld.so.preload").unlink()
    found = limiter.report(config)
    assert found["enforced"] is False
    assert found["files"] == {str(lib / "libvgpu.so"): True, str(lib / "ld.so.preload"): False}
    assert "NOT enforced" in str(found["line"])
    none = limiter.report(Config(slice_limiter="none"))
    assert none["files"] == {} and "PK_SLICE_LIMITER=none" in str(none["line"])


def test_a_capacity_document_from_before_the_limiter_key_reads_as_unknown() -> None:
    """Upgrades: an allocator of the previous version wrote no `slice_limiter`; status reads
    its document and says the enforcement is unknown rather than guessing."""
    old = b'{"type": "NodeCapacity", "v": 1, "node": "n", "at": 1.0, "cards": [{"index": 0, ' \
          b'"uuid": "GPU-0", "model": "A100-40GB", "mode": "sliced"}]}'
    capacity = decode(old, NodeCapacity, what="capacity")
    assert capacity.slice_limiter is None
    status = build("n", capacity, {}, {})
    assert status["slice_limiter"] is None
    assert "slices: enforcement unknown" in render(status)


def test_hami_core_limits_each_card_in_the_containers_device_order(tmp_path) -> None:
    """Slices on two cards: `CUDA_DEVICE_MEMORY_LIMIT_<i>` per card in card index order (the
    order NVIDIA_VISIBLE_DEVICES lists them), one SM limit, the smaller share."""
    cards = {1: Card(1, "GPU-b", "A100-40GB", "sliced", 40960),
             3: Card(3, "GPU-a", "A100-40GB", "sliced", 40960)}
    claims = [make_claim("c1", 0, 1, card=3), make_claim("c2", 0, 1, card=1),
              make_claim("c3", 1, 1, card=3)]
    shares = slices.per_card(claims, cards, 4)
    assert [(s.memory_mib, s.compute_percent) for s in shares] == [(10240, 25), (20480, 50)]
    edits = limiter.hami_edits([s.memory_mib for s in shares],
                               min(s.compute_percent for s in shares), tmp_path, "/c")
    assert dict(edits.env) == {"CUDA_DEVICE_MEMORY_LIMIT_0": "10240m",
                               "CUDA_DEVICE_MEMORY_LIMIT_1": "20480m",
                               "CUDA_DEVICE_SM_LIMIT": "25",
                               "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/c/vgpu.cache"}


async def test_a_node_without_sliced_cards_starts_without_the_limiters_files(
    nc, js, node, tmp_path
) -> None:
    """The same ConfigMap on a MIG-only node: nothing to enforce, so no refusal."""
    settings = {"slice_limiter": "hami-core", "slice_limiter_dir": tmp_path / "absent"}
    options = replace(FAST, limiter_lock_dir=tmp_path / "lock")
    async with node_stack(nc, node, settings=settings, options=options) as n:
        assert n.healthy("nvidia.com/mig-1g.10gb") > 0
    assert not (tmp_path / "lock").exists()
