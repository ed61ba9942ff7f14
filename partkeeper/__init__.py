"""partkeeper: accelerator partitions for Kubernetes Pods, allocated and reclaimed safely."""

__version__ = "0.1.0"
