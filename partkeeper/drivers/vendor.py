"""What the T-Head and Hygon bindings (and the sim, for `one_partition`) share: profile names,
models, and the one-partition rule of their container runtimes. Pure functions.

The placement checks every driver makes before a create are the MIG algorithm's (mig.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from partkeeper.drivers import profiles
from partkeeper.drivers.base import Instance, PlacementError

_GEOMETRY = re.compile(r"^(\d+)g\.?(\d+)gb$")


def normalise_profile(raw: str) -> str:
    """A vendor's profile name as a resource-name segment: "MIG 4g48gb" -> "4g.48gb".

    The `MIG ` prefix and whitespace go; the two-number geometry gets NVIDIA's dot. Any other
    shape (a `+` variant, say) is returned as the library spells it, without spaces."""
    name = "".join(raw.removeprefix("MIG ").split()).lower()
    match = _GEOMETRY.match(name)
    return f"{match[1]}g.{match[2]}gb" if match else name


def model_for(vendor: profiles.Vendor, memory_mib: int) -> str | None:
    """The profiles.py model of `vendor` nearest `memory_mib` (within 10 %), or None."""
    return profiles.nearest_model((m for m in profiles.MODELS.values() if m.vendor == vendor),
                                  memory_mib)


def one_partition(instances: Sequence[Instance], vendor: str) -> Instance:
    """The one partition a container of this vendor can use; more is refused with a sentence."""
    if len(instances) != 1:
        raise PlacementError(
            "allocate",
            instances[0].card if instances else None,
            None,
            f"a {vendor} container can use exactly one partition, and this one was given "
            f"{len(instances)}; request one partition per container",
        )
    return instances[0]
