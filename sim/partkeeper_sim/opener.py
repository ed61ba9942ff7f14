"""PK_DRIVER=sim: how the `partkeeper` driver registry opens the simulated driver, found through
the `partkeeper.drivers` entry point group (sim/pyproject.toml).

Importing this module imports the driver and what it needs, so a missing module is found when a
service starts, not at its first driver call.
"""

from __future__ import annotations

from partkeeper.config import Config
from partkeeper_sim.driver import SimDriver


def open_sim(config: Config) -> SimDriver:
    """The simulated cards in `config.sim_state`; the file is read at first use (a missing one
    fails then, with a ReadError naming it)."""
    return SimDriver(config.sim_state)
