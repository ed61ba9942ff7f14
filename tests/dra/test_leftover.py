"""Device-plugin mode over DRA claims left from DRA mode (services/allocator/dra/leftover.py);
the whole way back runs in tests/stack/test_migrate.py."""

from __future__ import annotations

from partkeeper.kubelet import dra_pb2
from services.allocator.dra.leftover import REFUSED, UnprepareOnly


async def test_a_device_plugin_allocator_prepares_no_dra_claim() -> None:
    preparer = UnprepareOnly(None, None)  # type: ignore[arg-type]  # prepare reads neither
    answer = await preparer.prepare(dra_pb2.Claim(namespace="d", uid="u", name="c"))
    assert answer.error == REFUSED and not answer.devices
