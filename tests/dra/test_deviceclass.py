"""The DeviceClass shipped in deploy/dra/ validates against the Kubernetes schema and is the one
the simulated cluster installs."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import yaml

from partkeeper_sim.dra_cluster import DEVICE_CLASS

MANIFEST = (Path(__file__).resolve().parents[2] / "deploy" / "components" / "dra"
            / "deviceclass.yaml")


def test_deviceclass_validates_and_matches_the_simulated_cluster() -> None:
    doc = yaml.safe_load(MANIFEST.read_text())
    kubernetes_validate.validate(doc, "1.36.0", strict=True)
    assert doc == DEVICE_CLASS
