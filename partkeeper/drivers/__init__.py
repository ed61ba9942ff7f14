"""Accelerator drivers: the interface partkeeper needs and how to open the configured one.

The implementations are imported on demand: `nvml` needs nvidia-ml-py and a GPU, `sim` a state
file, and neither should be a cost of importing the package (the CLI imports it for `--help`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from partkeeper.drivers.base import (
    Card,
    Driver,
    DriverError,
    IdentityMismatchError,
    IdentityRule,
    Instance,
    InstanceSpec,
    InUseError,
    Mode,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
)

if TYPE_CHECKING:
    from partkeeper.config import Config

__all__ = [
    "Card",
    "Driver",
    "DriverError",
    "IdentityMismatchError",
    "IdentityRule",
    "InUseError",
    "Instance",
    "InstanceSpec",
    "Mode",
    "NotFoundError",
    "PlacementError",
    "ReadError",
    "UnknownError",
    "open_driver",
]


def open_driver(config: Config) -> Driver:
    """The driver `config.driver` names: `sim` on `config.sim_state`, `nvml` (NVIDIA), `hgml`
    (T-Head PPU) or `dmi` (Hygon DCU).

    Opening the sim driver does not touch the state file (a missing one fails at first use, with a
    ReadError naming it); opening a vendor driver loads its library and raises LibraryMissing (a
    StartupError) if that fails. The vendors' host files are read under `config.driver_root` (and
    NVIDIA's and T-Head's procfs records under `config.proc_root`).
    """
    if config.driver == "sim":
        from partkeeper.drivers.sim import SimDriver

        return SimDriver(config.sim_state)
    if config.driver == "nvml":
        from partkeeper.drivers.nvidia.binding import NvmlDriver

        return NvmlDriver(root=config.driver_root, proc_root=config.proc_root)
    if config.driver == "hgml":
        from partkeeper.drivers.thead.binding import HgmlDriver

        return HgmlDriver(root=config.driver_root, proc_root=config.proc_root)
    if config.driver == "dmi":
        from partkeeper.drivers.hygon.binding import DmiDriver

        return DmiDriver(root=config.driver_root)
    raise ValueError(f"unknown driver {config.driver!r}; expected nvml, hgml, dmi or sim")
