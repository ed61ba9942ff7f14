"""`partkeeper up`: the embedded default. Not built yet; says so rather than pretending."""

from __future__ import annotations

import argparse
import sys


def main(args: argparse.Namespace) -> int:
    print(
        "partkeeper up: the embedded stack (NATS, simulated cluster, the four services) is not "
        "built yet in this version. What works today: `partkeeper sim ...` (the simulated "
        "driver) and the test suite (`make test`).",
        file=sys.stderr,
    )
    return 2
