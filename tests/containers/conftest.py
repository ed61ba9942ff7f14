"""The container tests' images: built once a session with `make image` and podman.

Marked `containers` (each module's pytestmark): `make test` deselects them, and `.ci/run`
runs them as their own step after tests/containers/setup.sh has installed podman and made the
base images. Run here without podman they fail saying so, rather than skip: a step that must run
in CI never passes by not running.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests_support.containers import SERVICE_IMAGE, SLIM_IMAGE, absent, make_image, podman


@pytest.fixture(scope="session")
def rig_ready() -> None:
    reason = absent()
    if reason is not None:
        pytest.fail(f"the container tests cannot run: {reason}")
    for base in ("python:3.11-slim",):
        if podman("image", "exists", base, check=False).returncode != 0:
            pytest.fail(f"no {base} image: tests/containers/setup.sh makes the local one")


@pytest.fixture(scope="session")
def slim_image(rig_ready: None) -> Iterator[str]:
    """`make image`: the services' image as operators build it, without the simulator."""
    make_image(SLIM_IMAGE)
    yield SLIM_IMAGE


@pytest.fixture(scope="session")
def sim_image(rig_ready: None) -> Iterator[str]:
    """`make image EXTRAS=sim IMAGE=partkeeper:dev`: the image compose/ runs."""
    make_image(SERVICE_IMAGE, extras="sim")
    yield SERVICE_IMAGE
