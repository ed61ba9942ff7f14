"""A small Kubernetes API server (Pods, Nodes, Events; list, watch, bookmarks, 410 Gone) that
the real `kubernetes` client talks to over HTTP. See docs/sim-apiserver.md."""

from .errors import ApiError
from .kubeconfig import write_kubeconfig
from .server import ApiServer, ApiServerThread
from .store import Change, Store

__all__ = ["ApiError", "ApiServer", "ApiServerThread", "Change", "Store", "write_kubeconfig"]
