"""Logging, tracing and metrics shared by the services."""
