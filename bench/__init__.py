"""Benchmarks: `python -m bench` runs them all and writes docs/benchmarks.md; `python -m
bench.<name>` runs one and prints its figures. They are not tests: nothing asserts a timing."""
