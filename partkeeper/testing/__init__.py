"""Helpers for tests and benchmarks that run real servers (never imported by services)."""
