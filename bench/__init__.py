"""Benchmarks: `python -m bench.<name>` prints figures; they are not tests."""
