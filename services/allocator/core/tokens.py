"""Device-plugin token health: a pure function of the claims, the Pods' states and capacity.

The token set of a resource never changes (its size is fixed by the cards, see `catalog`); only
health moves:

- a token held by a `creating` or `active` claim of a Pod not confirmed finished or gone is
  Healthy: kubelet holds it for that Pod;
- a token held by a `releasing` claim, or by a claim whose Pod is finished or gone, is Unhealthy
  until the destroy is confirmed and the claim removed: kubelet frees a stopped Pod's tokens
  before the partition is destroyed, and must not hand them out meanwhile;
- a token held by a claim on a failed card (or on a partition that failed by itself) is
  Unhealthy: kubelet must not count it among the node's usable devices (DESIGN.md, "Card
  health"); the claim itself is untouched;
- of the other tokens, exactly as many as can be placed now are Healthy, lowest first (a failed
  card places nothing, so its free room is not among them).

When kubelet hands one token to a new Pod before we learned that its old holder finished, two
claims carry it; the newest one decides its health.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from schemas import Claim


@dataclass(frozen=True, slots=True)
class Hold:
    """The claim that holds a token, reduced to what its health depends on."""

    claim_id: str
    state: str
    pod_dead: bool
    created_at: float
    failed: bool = False  # its card, or its partition, failed

    @property
    def healthy(self) -> bool:
        return self.state in ("creating", "active") and not self.pod_dead and not self.failed


def _never(claim: Claim) -> bool:
    return False


def holds(
    claims: Iterable[Claim], resource: str, pod_dead: Callable[[str], bool],
    failed: Callable[[Claim], bool] = _never,
) -> dict[str, Hold]:
    """Token -> the newest claim of `resource` carrying it; `failed` says whether a claim's card
    or partition failed."""
    found: dict[str, Hold] = {}
    for claim in claims:
        if claim.resource != resource:
            continue
        hold = Hold(claim.id, claim.state, pod_dead(claim.pod_uid), claim.created_at,
                    failed(claim))
        for token in claim.device_ids:
            current = found.get(token)
            if current is None or (hold.created_at, hold.claim_id) > (
                current.created_at,
                current.claim_id,
            ):
                found[token] = hold
    return found


def health(tokens: Sequence[str], held: Mapping[str, Hold], placeable: int) -> dict[str, bool]:
    """Token -> Healthy, for every token of the resource, in the token order."""
    result: dict[str, bool] = {}
    spare = max(0, placeable)
    for token in tokens:
        hold = held.get(token)
        if hold is not None:
            result[token] = hold.healthy
        elif spare > 0:
            result[token] = True
            spare -= 1
        else:
            result[token] = False
    return result
