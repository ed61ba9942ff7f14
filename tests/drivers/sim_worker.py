"""A separate process hammering one sim state file: `python sim_worker.py STATE SEED`.

Waits for a line on stdin (so that every worker starts together), then tries to create every
legal placement of every profile on the partition-mode cards in a shuffled order, and prints the
instances it was granted as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys

from partkeeper.drivers import profiles
from partkeeper.drivers.base import InstanceSpec, PlacementError
from partkeeper_sim.driver import SimDriver


def main(path: str, seed: int) -> None:
    driver = SimDriver(path)
    specs = [
        InstanceSpec(card.index, name, start)
        for card in driver.cards()
        if card.mode == "partition"
        for name, shape in profiles.model(card.model).profiles.items()
        for start in shape.starts
    ]
    random.Random(seed).shuffle(specs)
    sys.stdin.readline()
    made = []
    for spec in specs:
        try:
            made.append(dataclasses.asdict(driver.create(spec)))
        except PlacementError:
            continue
    json.dump(made, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
