"""NVML calls per operation: `python -m bench.nvml_calls [--rounds 200] [--busy 6]`.

The nvml driver over the C fake NVML (tests/fakes/nvml, built from nvml.h and loaded by the real
nvidia-ml-py, as the tests load it) on one H100-80GB. `--busy` 1g partitions are made first, so
a walk of the MIG devices finds that many; then each round creates a 1g partition at the last
free slot, asks whether it is busy, and destroys it. For each operation it prints the NVML calls
it made (counted by the fake), how many of them walk the MIG device indices, and the latency.

Goal (issue 23): one MIG-device walk per create, busy check and destroy; NVIDIA measured a walk
at seconds under load on real GPUs (k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/nvlib.go). The
floor printed beside it is one NVML call (nvmlDeviceGetCount) on the same fake, in the same run:
on the fake every call costs about that (a locked state file), so the latency is mostly
calls x floor, which is why the call count is the figure that carries over to a real GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WALK = "nvmlDeviceGetMaxMigDeviceCount"  # each walk of the MIG device indices starts here


@dataclass(frozen=True, slots=True)
class Op:
    name: str
    calls: int
    walks: int
    p50_ms: float
    p99_ms: float

    def line(self) -> str:
        return (f"{self.name:8} {self.calls:3d} NVML calls, {self.walks} MIG-device walk(s); "
                f"p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms")


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def measure(rounds: int = 200, busy: int = 6) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    from fakes import nvml as fake_nvml  # the test fake: a benchmark, never shipped

    from partkeeper.drivers.base import InstanceSpec
    from partkeeper.drivers.nvidia.binding import NvmlDriver

    with tempfile.TemporaryDirectory(prefix="pk-nvml-calls-") as tmp:
        here = Path(tmp)
        library = fake_nvml.build(here / "lib")
        fake = fake_nvml.FakeNvml.create(library, here / "nvml.state", here / "proc")
        fake.ensure_resolves()
        fake.add_gpu("H100-80GB")
        os.environ[fake.state_env] = str(fake.state)
        # Nodes made through a stand-in: the count is NVML's, not the host's mknod.
        driver = NvmlDriver(root=here / "root", proc_root=here / "proc",
                            make_node=lambda path, mode, device: Path(path).touch())
        driver.cards()  # the card's static facts, read once as a running service has them
        for start in range(busy):
            driver.create(InstanceSpec(0, "1g.10gb", start))
        spec = InstanceSpec(0, "1g.10gb", busy)
        samples: dict[str, list[tuple[int, int, float]]] = {"create": [], "busy": [],
                                                              "destroy": []}
        for _ in range(rounds):
            inst = _timed(fake, samples["create"], driver.create, spec)
            _timed(fake, samples["busy"], driver.is_busy, inst)
            _timed(fake, samples["destroy"], driver.destroy, inst)
        import pynvml  # loaded by the driver already: the floor is the same library's call

        floor = []
        for _ in range(rounds):
            started = time.perf_counter()
            pynvml.nvmlDeviceGetCount()
            floor.append((time.perf_counter() - started) * 1000)
        driver.close()
    ops = [_op(name, taken) for name, taken in samples.items()]
    lines = [
        f"goal: one MIG-device walk per operation (issue 23); H100-80GB with {busy} busy 1g "
        f"partitions, {rounds} rounds",
        *(op.line() for op in ops),
        f"floor: one NVML call p50 {statistics.median(floor):.3f} ms, p99 {_p99(floor):.3f} ms",
    ]
    command = f"python -m bench.nvml_calls --rounds {rounds} --busy {busy}"
    return {"lines": lines, "command": command, "ops": ops}


def _timed(fake: Any, into: list[tuple[int, int, float]], fn: Callable[..., Any],
           *args: Any) -> Any:
    calls, walks = fake.total_calls(), fake.calls(WALK)
    started = time.perf_counter()
    result = fn(*args)
    elapsed = (time.perf_counter() - started) * 1000
    into.append((fake.total_calls() - calls, fake.calls(WALK) - walks, elapsed))
    return result


def _op(name: str, taken: list[tuple[int, int, float]]) -> Op:
    calls = {c for c, _, _ in taken}
    walks = {w for _, w, _ in taken}
    assert len(calls) == len(walks) == 1, f"{name}: the call count varies between rounds"
    ms = [t for _, _, t in taken]
    return Op(name, calls.pop(), walks.pop(), statistics.median(ms), _p99(ms))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.nvml_calls", description=__doc__)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--busy", type=int, default=6, help="1g partitions made first (0-6)")
    args = parser.parse_args(argv)
    result = measure(args.rounds, args.busy)
    print("\n".join(result["lines"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
