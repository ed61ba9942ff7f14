"""What the reclaimer's decision tests share: a fixed clock, one recorded partition, a claim
builder and hypothesis strategies over claims, instances and the watcher's verdicts."""

from __future__ import annotations

from hypothesis import strategies as st

from partkeeper.drivers.base import Instance
from schemas import Claim, LiveInstance
from schemas.documents import ClaimKind
from schemas.events import ClaimState
from tests_support import UID

NOW = 10_000.0
TIMEOUT = 60.0
MINE = Instance(card=0, profile="1g.10gb", start=2, size=2, gi_id=3, ci_id=0, uuid="MIG-mine")
LIVE = LiveInstance(gi_id=MINE.gi_id, ci_id=MINE.ci_id, uuid=MINE.uuid)


def claim(state: ClaimState, *, recorded: bool = True, age: float = 600.0,
          kind: ClaimKind = "partition") -> Claim:
    return Claim(
        id="c1", kind=kind, state=state, pod_uid=UID, namespace="d", name="p", container="main",
        resource="nvidia.com/mig-1g.10gb", device_ids=["t1"], card=0, profile="1g.10gb",
        start=2, size=2, instance=LIVE if recorded and kind == "partition" else None,
        created_at=NOW - age, updated_at=NOW - age,
    )


instances = st.builds(
    Instance, card=st.just(0), profile=st.sampled_from(["1g.10gb", "2g.10gb"]),
    start=st.sampled_from([0, 2, 4, 6]), size=st.just(2), gi_id=st.integers(1, 7),
    ci_id=st.just(0), uuid=st.sampled_from(["MIG-mine", "MIG-other", "MIG-third"]),
)
claims = st.builds(
    claim, st.sampled_from(["creating", "active", "releasing", "removed", "exploded"]),
    recorded=st.booleans(), age=st.floats(0, 200), kind=st.sampled_from(["partition", "slice"]),
)
verdicts = st.sampled_from(["live", "finished", "gone", "unknown", "no-answer"])
