"""DRA mode publishes the 1.35 ResourceSlice shape and refuses an older API server at start,
with a sentence naming the version it found."""

from __future__ import annotations

import pytest

from partkeeper.errors import StartupError
from services.allocator.dra.versions import refusal
from tests_support.dra import dra_node


@pytest.mark.parametrize(("document", "refused"), [
    ({"major": "1", "minor": "35", "gitVersion": "v1.35.0"}, False),
    ({"major": "1", "minor": "36+", "gitVersion": "v1.36.1-gke.1"}, False),
    ({"major": "2", "minor": "0"}, False),
    ({"major": "1", "minor": "34", "gitVersion": "v1.34.2"}, True),
    ({"major": "1", "minor": "33+"}, True),
    ({"gitVersion": "weird"}, True),
    ("not a document", True),
])
def test_refusal(document, refused: bool) -> None:
    assert (refusal(document) is not None) is refused


def test_the_refusal_names_the_version() -> None:
    said = refusal({"major": "1", "minor": "34", "gitVersion": "v1.34.2"})
    assert said is not None and "v1.34.2" in said and "1.35 or later" in said


async def test_a_1_34_api_server_is_refused_at_start(nc, js, node, kubeconfig, apiserver) -> None:
    apiserver._state.kubernetes_version = "1.34"
    with pytest.raises(StartupError, match=r"v1\.34\.0.*1\.35 or later|1\.35 or later.*v1\.34"):
        async with dra_node(nc, node, kubeconfig):
            pass
