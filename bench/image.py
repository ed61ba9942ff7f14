"""The services' image: how long `make image` takes, how large the image is, how fast it starts.

Usage: python -m bench.image [--runs N] [--no-build]

Builds with podman and the container rig of tests/containers/ (tests/containers/setup.sh makes
the base image; without podman this prints why and measures nothing): the image operators build
(`make image`, no simulator) and the one compose runs (`EXTRAS=sim`). Start-up is the wall time
of `podman run --rm IMAGE --version` (the entry point's Python and `partkeeper` imported, the
container made and removed), median and worst of N runs, beside the floor of the same container
running `true` as its entry point (podman and runc alone). The issue set no target for either:
the figures are what an operator plans for, and what a change to the image is compared with.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from tests_support.containers import (  # noqa: E402 - the rig lives with the tests
    SERVICE_IMAGE,
    SLIM_IMAGE,
    make_image,
    podman,
    run_image,
)


def timed(image: str, *argv: str, entrypoint: str | None = None) -> float:
    started = time.monotonic()
    result = run_image(image, *argv, entrypoint=entrypoint)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"bench.image: {image} {' '.join(argv)} exited {result.returncode}: "
                         f"{result.stderr.strip()}")
    return elapsed


def size(image: str) -> int:
    return int(json.loads(podman("image", "inspect", image).stdout)[0]["Size"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.image")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-build", action="store_true", help="measure the images as built")
    args = parser.parse_args(argv)
    print("goal: none set in figures; the issue asks for the image's size and start-up time, "
          "measured (floor: the same container running `true`)")
    if shutil.which("podman") is None:
        print("image: not measured: podman is not installed (tests/containers/setup.sh)")
        return 0
    if podman("image", "exists", "python:3.11-slim", check=False).returncode != 0:
        print("image: not measured: no python:3.11-slim base image (tests/containers/setup.sh)")
        return 0
    for image, extras in ((SLIM_IMAGE, ""), (SERVICE_IMAGE, "sim")):
        if not args.no_build:
            seconds = make_image(image, extras)
            print(f"make image{' EXTRAS=' + extras if extras else ''}: {seconds:.0f} s "
                  "(layers cached up to the pip install)")
        print(f"image {image}: {size(image) / 1e6:.0f} MB")
    base = size("python:3.11-slim")
    print(f"base python:3.11-slim (Debian bookworm minbase + venv, the stand-in): "
          f"{base / 1e6:.0f} MB")
    timed(SLIM_IMAGE, "--version")  # the first run pays for the image's layers to be mounted
    starts = [timed(SLIM_IMAGE, "--version") for _ in range(args.runs)]
    floor = [timed(SLIM_IMAGE, entrypoint="true") for _ in range(args.runs)]
    print(f"start-up (podman run --rm {SLIM_IMAGE} --version, {args.runs} runs): "
          f"median {statistics.median(starts):.2f} s, max {max(starts):.2f} s")
    print(f"floor (the same container running `true`): median {statistics.median(floor):.2f} s, "
          f"max {max(floor):.2f} s")
    imports = run_image(SLIM_IMAGE, "-X", "importtime", "-c", "import services.allocator.main",
                        entrypoint="python")
    cumulative = [int(line.split("|")[1]) for line in imports.stderr.splitlines()
                  if line.startswith("import time:") and line.split("|")[1].strip().isdigit()]
    if cumulative:
        print(f"importing the allocator in the image: {max(cumulative) / 1e6:.2f} s "
              "(python -X importtime, the largest cumulative)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
