"""The handoff on a Hygon node: the Allocate reply and, with the CDI strategy, the partition's CDI
spec carry the dmi driver's container edits (device nodes, mounts, DMI_MIG_VISIBLE_DEVICE)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from partkeeper import cdi
from partkeeper.bus.kv import Bucket
from partkeeper.claims import ClaimsStore
from partkeeper.config import Config
from partkeeper.drivers.base import InstanceSpec
from services.allocator.core import handoff
from services.allocator.core.state import Context
from services.allocator.deviceplugin import plugin
from tests_support.drivers import active_claim
from tests_support.vendor_rigs import hygon_rig, open_dmi


async def test_a_dcu_partition_is_handed_over_with_hygon_s_edits_and_cdi_spec(
    dmi_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, js, node: str
) -> None:
    rig = hygon_rig(dmi_library, tmp_path, monkeypatch, 1)
    rig.require_nodes()
    driver = open_dmi(rig)
    inst = driver.create(InstanceSpec(0, "4g.31gb", 2))
    claims = [active_claim(inst, "c0")]
    config = Config(node=node, driver="dmi", device_list_strategy="cdi",
                    cdi_dir=tmp_path / "cdi", driver_root=rig.root)
    store = ClaimsStore(await Bucket.open(js, "pk-claims"), node)
    ctx = Context(config, js._nc, js, store, driver, tuple(driver.cards()),
                  {}, None, None)  # type: ignore[arg-type]  # parts unused here
    edits, names = await handoff.partition_handoff(ctx, claims)
    response = plugin.partition_response(claims, edits, names)
    record = "/etc/dmi_mig_config/ci/dev0gi1ci0.conf"
    assert response.envs["DMI_MIG_VISIBLE_DEVICE"] == inst.uuid
    assert "NVIDIA_VISIBLE_DEVICES" not in response.envs
    assert [d.container_path for d in response.devices] == [
        "/dev/kfd", "/dev/mkfd", "/dev/dri/card1", "/dev/dri/renderD128"]
    assert [(m.container_path, m.read_only) for m in response.mounts] == [
        ("/opt/hyhal", True), (record, True)]
    spec = json.loads(cdi.spec_path(config.cdi_dir, "c0").read_text())
    container = spec["devices"][0]["containerEdits"]
    assert container["env"][0] == f"DMI_MIG_VISIBLE_DEVICE={inst.uuid}"
    assert not any(e.startswith("NVIDIA_VISIBLE_DEVICES") for e in container["env"])
    assert [n["path"] for n in container["deviceNodes"]] == [
        d.container_path for d in response.devices]
    assert container["mounts"][1] == {"containerPath": record, "hostPath": str(rig.root) + record,
                                      "options": ["ro", "bind"]}
