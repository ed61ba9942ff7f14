"""The pure rule for card events (partkeeper/drivers/cardhealth.py): exhaustive, by property."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partkeeper.drivers.cardhealth import (
    APPLICATION_XIDS,
    NO_INSTANCE,
    CardEvent,
    CardHealth,
    EventKind,
    Fault,
    Scope,
    XidPolicy,
    classify,
    parse_xids,
    policy,
)

CRITICAL = (48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 999)


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_fail_nothing(xid: int) -> None:
    for gi, ci in ((NO_INSTANCE, NO_INSTANCE), (3, 0)):
        assert classify(CardEvent(0, EventKind.XID, xid, gi, ci), policy()).scope is Scope.NONE


@pytest.mark.parametrize("xid", CRITICAL)
def test_critical_xids_fail_the_card_or_the_instance_they_name(xid: int) -> None:
    card = classify(CardEvent(2, EventKind.XID, xid), policy())
    assert (card.card, card.scope, card.cause) == (2, Scope.CARD, f"xid-{xid}")
    assert f"XID {xid}" in card.meaning
    one = classify(CardEvent(2, EventKind.XID, xid, 5, 0), policy())
    assert (one.scope, one.instance) == (Scope.INSTANCE, (5, 0))
    # Only a GI without a CI (or the reverse) is not one partition: the card.
    half = classify(CardEvent(2, EventKind.XID, xid, 5, NO_INSTANCE), policy())
    assert half.scope is Scope.CARD


@pytest.mark.parametrize(
    ("kind", "scope"),
    [
        (EventKind.LOST, Scope.CARD),
        (EventKind.ECC_UNCORRECTABLE, Scope.CARD),
        (EventKind.ECC_CORRECTABLE, Scope.NONE),
        (EventKind.RECOVERED, Scope.RECOVERED),
    ],
)
def test_the_other_kinds(kind: EventKind, scope: Scope) -> None:
    assert classify(CardEvent(1, kind), policy()).scope is scope


def test_the_operators_switches() -> None:
    assert policy(ignore="48, 79").ignores(79)
    assert not policy(ignore="48", enable="48").ignores(48)
    everything = policy(ignore="all", enable="79")
    assert everything.ignores(48) and not everything.ignores(79)
    assert not policy(enable="13").ignores(13)
    for bad in ("4x", "-1", "all-but"):
        with pytest.raises(ValueError, match="PK_HEALTH_IGNORE_XIDS"):
            policy(ignore=bad)
    assert parse_xids(" , ", "X") == (frozenset(), False)


events = st.builds(
    CardEvent,
    card=st.integers(0, 3),
    kind=st.sampled_from(EventKind),
    xid=st.sampled_from((*CRITICAL, *sorted(APPLICATION_XIDS))),
    gi=st.sampled_from((NO_INSTANCE, 1, 3, 7)),
    ci=st.sampled_from((NO_INSTANCE, 0)),
)
policies = st.builds(
    XidPolicy,
    ignored=st.frozensets(st.sampled_from(CRITICAL)).map(lambda s: s | APPLICATION_XIDS),
    enabled=st.frozensets(st.sampled_from(CRITICAL)),
    ignore_all=st.booleans(),
)


@given(st.lists(events, max_size=30), policies)
def test_the_fold(history: list[CardEvent], rules: XidPolicy) -> None:
    faults = [classify(e, rules) for e in history]
    health = CardHealth().fold(faults)
    for card in range(4):
        mine = [f for f in faults if f.card == card]
        since = mine[max((i + 1 for i, f in enumerate(mine) if f.scope is Scope.RECOVERED),
                         default=0):]
        fatal = [f for f in since if f.scope is Scope.CARD]
        # A card is failed exactly when a card-wide fault came after its last recovery, and it
        # keeps the first cause: the one its Pods were told.
        assert health.card_fault(card) == (fatal[0] if fatal else None)
        for f in since:
            if f.scope is Scope.INSTANCE:
                assert f.instance is not None
                assert health.instance_fault(card, *f.instance) is not None
    assert health.failed_cards() == {c for c, _ in health.cards}


@given(st.lists(events, max_size=20), policies)
def test_what_fails_nothing_changes_nothing(history: list[CardEvent], rules: XidPolicy) -> None:
    faults = [classify(e, rules) for e in history]
    health = CardHealth().fold(faults)
    quiet = Fault(0, Scope.NONE, "ecc-correctable", "")
    assert health.apply(quiet) == health
