"""`partkeeper status`: not built yet; says so rather than pretending."""

from __future__ import annotations

import argparse
import sys


def main(args: argparse.Namespace) -> int:
    print("partkeeper status: not built yet in this version.", file=sys.stderr)
    return 2
