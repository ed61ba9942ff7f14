"""Accelerator drivers: the interface partkeeper needs and how to open the configured one.

The implementations are imported on demand: `nvml` needs nvidia-ml-py and a GPU, and should not
be a cost of importing the package (the CLI imports it for `--help`). `sim` is another
distribution's (partkeeper-sim, ./sim in this repository), found through the `partkeeper.drivers`
entry point group; without it, PK_DRIVER=sim is a start-up error saying what to install.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
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
    LibraryMissing,
    Mode,
    NotFoundError,
    PlacementError,
    ReadError,
    UnknownError,
)

if TYPE_CHECKING:
    from partkeeper.config import Config

__all__ = [
    "SIMULATOR",
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
    "require_installed",
]

# The drivers another distribution provides (its `partkeeper.drivers` entry point opens one from
# the Config), and what to install for each.
SIMULATOR = "pip install partkeeper-sim (./sim in this repository)"
PLUGINS = {"sim": ("the simulator", SIMULATOR)}


def open_driver(config: Config) -> Driver:
    """The driver `config.driver` names: `sim` on `config.sim_state`, `nvml` (NVIDIA), `hgml`
    (T-Head PPU) or `dmi` (Hygon DCU).

    Opening the sim driver does not touch the state file (a missing one fails at first use, with a
    ReadError naming it); without partkeeper-sim it raises LibraryMissing (require_installed).
    Opening a vendor driver loads its library and raises LibraryMissing (a StartupError) if that
    fails. The vendors' host files are read under `config.driver_root` (and
    NVIDIA's and T-Head's procfs records under `config.proc_root`).
    """
    if config.driver in PLUGINS:
        return _plugin(config.driver)(config)
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


def require_installed(driver: str) -> None:
    """Raise LibraryMissing, one sentence naming what to install, when `driver` is another
    distribution's and it (or a module it needs) is not installed; nothing for the built-in
    drivers, whose libraries load when they are opened. Every service calls it at start-up."""
    if driver in PLUGINS:
        _plugin(driver)


def _plugin(driver: str) -> Callable[[Config], Driver]:
    what, install = PLUGINS[driver]
    absent = f"PK_DRIVER={driver} needs {what}: {install}"
    found = entry_points(group="partkeeper.drivers", name=driver)
    if not found:
        raise LibraryMissing(absent)
    entry = next(iter(found))
    try:
        opener: Callable[[Config], Driver] = entry.load()
    except ModuleNotFoundError as exc:  # installed metadata, but a module it needs is not there
        if exc.name and exc.name.split(".")[0] == entry.module.split(".")[0]:
            raise LibraryMissing(absent) from exc
        raise LibraryMissing(f"PK_DRIVER={driver} needs {what}, whose dependency {exc.name} is "
                             f"not installed: {install}") from exc
    return opener
