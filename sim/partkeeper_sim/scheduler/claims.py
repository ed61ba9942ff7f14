"""What the resource-claim controller does, pure: name a Pod's claims, make the claim a template
asks for, and decide what happens to a claim once the Pods it is reserved for are done.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Mapping
from typing import Any

POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
TERMINAL = ("Succeeded", "Failed")


def entries(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((pod.get("spec") or {}).get("resourceClaims") or [])


def claim_name(pod: Mapping[str, Any], entry: Mapping[str, Any]) -> str | None:
    """The ResourceClaim behind one of the Pod's entries, or None while a template's claim has
    not been made yet."""
    if entry.get("resourceClaimName"):
        return str(entry["resourceClaimName"])
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == entry.get("name"):
            return status.get("resourceClaimName")
    return None


def from_template(pod: Mapping[str, Any], entry: Mapping[str, Any],
                  template: Mapping[str, Any]) -> dict[str, Any]:
    """The ResourceClaim a template makes for one Pod, owned by the Pod."""
    meta = pod["metadata"]
    body = copy.deepcopy((template.get("spec") or {}).get("spec") or {})
    name = f"{meta['name']}-{entry['name']}-{secrets.token_hex(3)}"[:253]
    return {
        "metadata": {
            "name": name, "namespace": meta.get("namespace", "default"),
            "annotations": {POD_CLAIM_ANNOTATION: entry["name"]},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True,
                                 "blockOwnerDeletion": True}],
        },
        "spec": body,
    }


def owner_uid(claim: Mapping[str, Any]) -> str | None:
    for ref in (claim.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Pod" and ref.get("controller"):
            return ref.get("uid")
    return None


def pod_done(pods: Mapping[str, Mapping[str, Any]], uid: str) -> bool:
    """The Pod is deleted or in a terminal phase: it no longer uses its claims."""
    pod = pods.get(uid)
    return pod is None or (pod.get("status") or {}).get("phase") in TERMINAL


def after_done(claim: Mapping[str, Any], pods: Mapping[str, Mapping[str, Any]]
               ) -> tuple[str, list[dict[str, Any]]] | None:
    """What to do with `claim` given the Pods: None (nothing), ("reserve", refs) to keep only
    the Pods still using it, ("deallocate", []) or ("delete", [])."""
    status = claim.get("status") or {}
    refs = list(status.get("reservedFor") or [])
    still = [r for r in refs if not pod_done(pods, str(r.get("uid")))]
    owner = owner_uid(claim)
    if still:
        return ("reserve", still) if len(still) != len(refs) else None
    if owner is not None and pod_done(pods, owner):
        return ("delete", [])
    if status.get("allocation") is not None and refs:
        return ("deallocate", [])
    return None
