"""What the GC may delete, as a function of (directory listing, pods.get answer, claims answer).

Deterministic, no side effects. `None` for an answer means the question went unanswered (no
responder, timeout, an error reply or an undecodable one); an unanswered question never lets
anything be deleted.

What is the GC's: a `c-<container>/sliced/` tree whose ownership mark names exactly this Pod and
container, and afterwards the `c-*` and Pod directories that are empty. What is never the GC's:
partition descriptors (the allocator's and reclaimer's), and anything it does not recognise
(which it reports and leaves, and which therefore keeps its parent directories alive).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from partkeeper.podstate import is_dead
from partkeeper.workdir import PodListing
from schemas import ClaimsReply, PodsGetReply

Verdict = Literal["collect", "nothing", "defer", "refuse"]
# Why, for metrics and tests; `reason` is the sentence for people.
Code = Literal[
    "confirmed", "no-directory", "nothing-ours", "unsafe", "pods-unanswered",
    "claims-unanswered", "live", "unknown", "creating",
]
UNANSWERED: frozenset[Code] = frozenset({"pods-unanswered", "claims-unanswered"})

# Pod states after which nothing runs in the Pod's containers any more.


@dataclass(frozen=True, slots=True)
class Plan:
    """`collect`: do the listed deletions. `nothing`: nothing of ours is there. `defer`: ask again
    later (a question went unanswered, or the allocator is mid-write). `refuse`: the Pod is not
    confirmed gone or finished, or its directory is unsafe; leave everything.
    """

    verdict: Verdict
    code: Code
    reason: str
    sliced: tuple[str, ...] = ()  # containers whose owned sliced/ tree is deleted
    rmdirs: tuple[str, ...] = ()  # c-<container> entries removed if empty afterwards
    pod_rmdir: bool = False  # the Pod directory is removed if empty afterwards
    report: tuple[str, ...] = field(default=(), compare=False)  # unrecognised, left in place


def confirmed_done(pod: PodsGetReply | None) -> bool:
    """The watcher said gone or finished: only then is the claims question worth asking."""
    return pod is not None and is_dead(pod.state)


def _unrecognised(listing: PodListing) -> tuple[str, ...]:
    uid = listing.uid
    found = [f"{uid}/{e.name} ({e.kind})" for e in listing.others]
    for c in listing.containers:
        found += [f"{uid}/{c.entry}/{e.name} ({e.kind})" for e in c.others]
        if c.sliced not in ("absent", "owned"):
            found.append(f"{uid}/{c.entry}/sliced ({c.sliced})")
    return tuple(found)


def candidates(listing: PodListing) -> Plan:
    """What would be deleted if both questions came back allowing it (no question asked yet).

    A `nothing` here means the GC need not ask anybody about this Pod.
    """
    report = _unrecognised(listing)
    if listing.state == "absent":
        return Plan("nothing", "no-directory", "no Pod directory")
    if listing.state == "unsafe":
        return Plan("refuse", "unsafe", f"Pod directory is unsafe: {listing.problem}",
                    report=report)
    sliced = tuple(c.container for c in listing.containers if c.sliced == "owned")
    emptied = tuple(
        c.entry
        for c in listing.containers
        if not c.descriptors and not c.others and c.sliced in ("absent", "owned")
    )
    pod_rmdir = not listing.others and len(emptied) == len(listing.containers)
    if not (sliced or emptied or pod_rmdir):
        return Plan("nothing", "nothing-ours", "nothing of the GC's in the Pod directory",
                    report=report)
    return Plan("collect", "confirmed", "owned artifacts", sliced, emptied, pod_rmdir, report)


def decide(
    listing: PodListing,
    pod: PodsGetReply | None,
    claims: ClaimsReply | None,
    work: Plan | None = None,
) -> Plan:
    """The deletions allowed for this Pod, given both answers (None: unanswered).

    `work` is `candidates(listing)` when the caller has it already (the sweep does)."""
    work = work or candidates(listing)
    if work.verdict != "collect":
        return work
    uid = listing.uid
    if pod is None or pod.uid != uid:
        return Plan("defer", "pods-unanswered", "pods.get did not answer for this Pod",
                    report=work.report)
    if not is_dead(pod.state):
        code: Code = "live" if pod.state == "live" else "unknown"
        return Plan("refuse", code, f"Pod is {pod.state} ({pod.evidence or 'no evidence'})",
                    report=work.report)
    if claims is None:
        return Plan("defer", "claims-unanswered", "claims.query did not answer",
                    report=work.report)
    creating = sorted(c.id for c in claims.claims if c.pod_uid == uid and c.state == "creating")
    if creating:
        # The allocator writes the slice's files while its claim is `creating`; let it finish.
        return Plan("defer", "creating", f"claim(s) {', '.join(creating)} still creating",
                    report=work.report)
    return Plan("collect", "confirmed", f"Pod is {pod.state} ({pod.evidence or 'no evidence'})",
                work.sliced, work.rmdirs, work.pod_rmdir, work.report)
