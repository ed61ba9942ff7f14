"""The driver harnesses: a driver plus the hands a test needs on its "hardware".

A driver added later adds a harness here and an entry in conftest's `HARNESSES`; the contract
suite (test_contract.py) then runs on it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fakes import nvml as fake_nvml_lib
from fakes.nvml import FakeNvml

from partkeeper.drivers.base import Driver, Instance
from partkeeper.drivers.sim import SimDriver

# The node every harness models: cards 0-2 in partition mode, card 3 sliced.
PARTITION_CARDS = ["H100-80GB", "A100-40GB", "H200-141GB"]
SLICED_CARDS = ["A100-40GB"]


class Harness(Protocol):
    """A driver plus the hands a test needs on its "hardware"."""

    kind: str
    driver: Driver

    def set_busy(self, instance: Instance, on: bool) -> None: ...

    def break_next_list(self) -> None: ...


@dataclass
class SimHarness:
    driver: SimDriver
    kind: str = "sim"

    def set_busy(self, instance: Instance, on: bool) -> None:
        self.driver.set_busy(instance.uuid, on)

    def break_next_list(self) -> None:
        self.driver.fail("list", 1)


@dataclass
class NvmlHarness:
    """The real nvidia-ml-py over the fake libnvidia-ml.so.1 (tests/fakes/nvml)."""

    driver: Driver
    fake: FakeNvml
    kind: str = "nvml"

    def set_busy(self, instance: Instance, on: bool) -> None:
        self.fake.set_processes(instance.uuid, 1 if on else 0)

    def break_next_list(self) -> None:
        self.fake.fail("nvmlDeviceGetGpuInstances", fake_nvml_lib.ERROR_UNKNOWN)
