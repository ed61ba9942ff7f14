"""Recognising a retried Allocate: pure. kubelet passes the same device IDs again for the same
container; those IDs are on the claims it got the first time (invariant 7).

Whether the claims' Pod may still be asking (it is being admitted, not Running) is the caller's
question (`partkeeper.podstate.being_admitted`): the same IDs reach a Running Pod's successor when
kubelet has freed them because the Pod's containers stopped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from schemas import Claim


def existing(claims: Iterable[Claim], resource: str, device_ids: Sequence[str]) -> list[Claim]:
    """The creating/active claims of one container that carry these device IDs.

    A token carried by several claims (kubelet re-used it after its first holder stopped) belongs
    to the newest. Empty when no claim carries them, or when they are spread over several
    containers' claims: then kubelet re-used freed tokens and this is a new allocation. Claims
    carrying only some of the IDs are a group whose writing was cut short (a crash between the
    claim writes) only when all of them are still `creating`; see `missing`.
    """
    wanted = set(device_ids)
    newest: dict[str, Claim] = {}
    for claim in claims:
        if claim.resource != resource or claim.state not in ("creating", "active"):
            continue
        for token in wanted.intersection(claim.device_ids):
            current = newest.get(token)
            if current is None or (claim.created_at, claim.id) > (current.created_at, current.id):
                newest[token] = claim
    mine = list({c.id: c for c in newest.values()}.values())
    if not mine:
        return []
    owners = {(c.pod_uid, c.container) for c in mine}
    carried = {t for c in mine for t in c.device_ids}
    if len(owners) != 1 or not carried <= wanted:
        return []
    if carried != wanted and any(c.state != "creating" for c in mine):
        return []
    return mine


def missing(group: Iterable[Claim], device_ids: Sequence[str]) -> list[str]:
    """The IDs of a retried Allocate that no claim of its group carries yet, in their order."""
    carried = {t for c in group for t in c.device_ids}
    return [t for t in device_ids if t not in carried]
