"""The discovery documents: just enough for clients that look before they call."""

from __future__ import annotations

from typing import Any

from . import resource
from .events import EVENTS_API

# The version the server claims by default (ServerState.kubernetes_version): resource.k8s.io/v1
# with counter sets in slices of their own and the ResourceSlice rules of resourceslice.py are
# those of 1.35 (and 1.36).
VERSION = {
    "major": "1",
    "minor": "35",
    "gitVersion": "v1.35.0-partkeeper-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-01-01T00:00:00Z",
    "goVersion": "go1.22",
    "compiler": "gc",
    "platform": "linux/amd64",
}

def version(release: str) -> dict[str, Any]:
    """The /version document of a server claiming `release` ("1.35")."""
    major, _, minor = release.partition(".")
    return {**VERSION, "major": major, "minor": minor,
            "gitVersion": f"v{major}.{minor}.0-partkeeper-sim"}


_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _resource(name: str, kind: str, namespaced: bool, verbs: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "singularName": "",
        "namespaced": namespaced,
        "kind": kind,
        "verbs": verbs,
    }


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def core_resources() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            _resource("pods", "Pod", True, _VERBS),
            _resource("pods/status", "Pod", True, ["get", "patch", "update"]),
            _resource("pods/binding", "Binding", True, ["create"]),
            _resource("nodes", "Node", False, _VERBS),
            _resource("nodes/status", "Node", False, ["get", "patch", "update"]),
            _resource("events", "Event", True, _VERBS),
        ],
    }


def api_groups() -> dict[str, Any]:
    version = {"groupVersion": EVENTS_API, "version": "v1"}
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {"name": "events.k8s.io", "versions": [version], "preferredVersion": version},
            resource.group(),
        ],
    }


def events_group() -> dict[str, Any]:
    version = {"groupVersion": EVENTS_API, "version": "v1"}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": "events.k8s.io",
        "versions": [version],
        "preferredVersion": version,
    }


def events_resources() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "groupVersion": EVENTS_API,
        "resources": [_resource("events", "Event", True, _VERBS)],
    }


def resource_group() -> dict[str, Any]:
    return {"kind": "APIGroup", "apiVersion": "v1", **resource.group()}


def resource_resources() -> dict[str, Any]:
    return resource.api_resources()
