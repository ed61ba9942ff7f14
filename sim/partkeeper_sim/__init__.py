"""The simulated cluster: a small Kubernetes API server, a kubelet and a MIG driver, so the real
services run against real protocols without hardware or a cluster."""
