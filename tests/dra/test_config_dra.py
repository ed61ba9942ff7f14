"""DRA mode's configuration."""

from __future__ import annotations

import pytest

from partkeeper.config import ConfigError, load


def test_dra_settings_default_to_kubelets_layout() -> None:
    config = load({"PK_NODE_NAME": "n"})
    assert config.mode == "deviceplugin" and str(config.cdi_dir) == "/var/run/cdi"
    assert str(config.kubelet_plugins_dir) == "/var/lib/kubelet/plugins"
    assert str(config.kubelet_registry_dir) == "/var/lib/kubelet/plugins_registry"
    moved = load({"PK_NODE_NAME": "n", "PK_MODE": "dra", "PK_KUBELET_DIR": "/k/device-plugins"})
    assert moved.mode == "dra"
    assert str(moved.kubelet_plugins_dir) == "/k/plugins"
    assert str(moved.kubelet_registry_dir) == "/k/plugins_registry"
    given = load({"PK_NODE_NAME": "n", "PK_KUBELET_PLUGINS_DIR": "/p",
                  "PK_KUBELET_REGISTRY_DIR": "/r", "PK_CDI_DIR": "/c"})
    assert (str(given.kubelet_plugins_dir), str(given.kubelet_registry_dir),
            str(given.cdi_dir)) == ("/p", "/r", "/c")


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="PK_MODE='csi' is not valid"):
        load({"PK_NODE_NAME": "n", "PK_MODE": "csi"})
