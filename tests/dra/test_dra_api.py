"""The generated DRA and plugin-registration modules: the wire facts kubelet depends on."""

from __future__ import annotations

from pathlib import Path

import pytest

from partkeeper.kubelet import dra_pb2, dra_registration_pb2, regen

DRA_FIELDS = [
    ("NodePrepareResourcesRequest", "claims", 1),
    ("NodePrepareResourcesResponse", "claims", 1),
    ("NodePrepareResourceResponse", "devices", 1),
    ("NodePrepareResourceResponse", "error", 2),
    ("Device", "request_names", 1),
    ("Device", "pool_name", 2),
    ("Device", "device_name", 3),
    ("Device", "cdi_device_ids", 4),
    ("NodeUnprepareResourcesRequest", "claims", 1),
    ("NodeUnprepareResourcesResponse", "claims", 1),
    ("NodeUnprepareResourceResponse", "error", 1),
    ("Claim", "namespace", 1),
    ("Claim", "uid", 2),
    ("Claim", "name", 3),
]

REGISTRATION_FIELDS = [
    ("PluginInfo", "type", 1),
    ("PluginInfo", "name", 2),
    ("PluginInfo", "endpoint", 3),
    ("PluginInfo", "supported_versions", 4),
    ("RegistrationStatus", "plugin_registered", 1),
    ("RegistrationStatus", "error", 2),
]


@pytest.mark.parametrize(("message", "name", "number"), DRA_FIELDS)
def test_dra_field_numbers(message: str, name: str, number: int) -> None:
    assert dra_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name[name].number == number


@pytest.mark.parametrize(("message", "name", "number"), REGISTRATION_FIELDS)
def test_registration_field_numbers(message: str, name: str, number: int) -> None:
    fields = dra_registration_pb2.DESCRIPTOR.message_types_by_name[message].fields_by_name
    assert fields[name].number == number


def test_method_paths_match_kubelet() -> None:
    services = {
        s.full_name: sorted(m.name for m in s.methods)
        for d in (dra_pb2.DESCRIPTOR, dra_registration_pb2.DESCRIPTOR)
        for s in d.services_by_name.values()
    }
    assert services == {
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": ["NodePrepareResources",
                                                     "NodeUnprepareResources"],
        "pluginregistration.Registration": ["GetInfo", "NotifyRegistrationStatus"],
    }


@pytest.mark.parametrize("name", ["dra_pb2.py", "dra_pb2_grpc.py", "dra_registration_pb2.py",
                                  "dra_registration_pb2_grpc.py"])
def test_checked_in_modules_carry_no_version_guard(name: str) -> None:
    text = (Path(regen.__file__).parent / name).read_text(encoding="utf-8")
    for guard in ("_runtime_version", "GRPC_GENERATED_VERSION", "_registered_method"):
        assert guard not in text
