"""Benchmarks: `python -m bench` runs them all and writes docs/benchmarks.md; `python -m
bench.<name>` runs one and prints its figures. They are not tests: nothing asserts a timing.

The rigs benchmarks drive the stack with (the embedded stack with killable parts, Pod churn, the
convergence check) are test support, not shipped code: they live in `tests/tests_support/`, which
is put on the import path here, as pytest's `pythonpath = ["tests"]` does for the tests.
"""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent.parent / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
