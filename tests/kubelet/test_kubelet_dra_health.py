"""The DRA resource-health API as generated, and which version the simulated kubelet asks a
plugin for (after kubelet's pickHealthService, pkg/kubelet/cm/dra/plugin,
dra_plugin_manager_test.go TestPickHealthService)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from partkeeper.kubelet import (
    dra_health_v1_pb2,
    dra_health_v1alpha1_pb2,
    dra_health_v1beta1_pb2,
    regen,
)
from partkeeper_sim.kubelet.drahealth import pick_service
from services.allocator.dra.health import SERVICES

ALL = [dra_health_v1_pb2, dra_health_v1beta1_pb2, dra_health_v1alpha1_pb2]


@pytest.mark.parametrize(("supported", "chosen"), [
    (["v1beta1.DRAPlugin"], ""),
    ([], ""),
    (["v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"], "v1alpha1.DRAResourceHealth"),
    (["v1beta1.DRAPlugin", "v1.DRAResourceHealth"], "v1.DRAResourceHealth"),
    (["v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"], "v1.DRAResourceHealth"),
    (["v1alpha1.DRAResourceHealth", "v1beta1.DRAResourceHealth"], "v1beta1.DRAResourceHealth"),
    (["v1.DRAPlugin", *SERVICES], "v1.DRAResourceHealth"),  # what our plugin registers
])
def test_the_kubelet_picks_the_newest_health_service_listed(supported: list[str],
                                                            chosen: str) -> None:
    assert pick_service(supported) == chosen


@pytest.mark.parametrize("pb2", ALL, ids=["v1", "v1beta1", "v1alpha1"])
def test_service_names_and_paths_are_the_apis(pb2: ModuleType) -> None:
    (service,) = pb2.DESCRIPTOR.services_by_name.values()
    version = pb2.DESCRIPTOR.package
    # The name kubelet looks for in supported_versions is the service's full name.
    assert service.full_name == f"{version}.DRAResourceHealth"
    assert service.full_name in SERVICES
    (method,) = service.methods
    assert method.name == "NodeWatchResources" and method.server_streaming
    assert not method.client_streaming


@pytest.mark.parametrize("pb2", ALL, ids=["v1", "v1beta1", "v1alpha1"])
def test_field_numbers_and_enum_values(pb2: ModuleType) -> None:
    health = pb2.DeviceHealth.DESCRIPTOR.fields_by_name
    assert (health["device"].number, health["health"].number,
            health["last_updated_time"].number) == (1, 2, 3)
    ident = pb2.DeviceIdentifier.DESCRIPTOR.fields_by_name
    assert (ident["pool_name"].number, ident["device_name"].number) == (1, 2)
    assert pb2.NodeWatchResourcesResponse.DESCRIPTOR.fields_by_name["devices"].number == 1
    assert (pb2.UNKNOWN, pb2.HEALTHY, pb2.UNHEALTHY) == (0, 1, 2)
    if pb2 is dra_health_v1alpha1_pb2:
        assert set(health) == {"device", "health", "last_updated_time"}
    else:
        assert (health["health_check_timeout_seconds"].number, health["message"].number) == (4, 5)


@pytest.mark.parametrize("name", [f"dra_health_{v}_pb2{s}.py" for v in ("v1", "v1beta1", "v1alpha1")
                                  for s in ("", "_grpc")])
def test_checked_in_modules_carry_no_version_guard(name: str) -> None:
    text = (Path(regen.__file__).parent / name).read_text(encoding="utf-8")
    for guard in ("_runtime_version", "GRPC_GENERATED_VERSION", "_registered_method"):
        assert guard not in text
