"""What an Allocate plans on without reading again (`state.Views`): when the
views are current, when they are not, and what a plan on stale ones comes to."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partkeeper.drivers import Instance
from services.allocator.core.state import Enumeration, Views
from tests_support.allocator import FAST, MIG, node_stack

R1 = MIG + "1g.10gb"
SOME: Enumeration = {0: (Instance(0, "1g.10gb", 0, 1, 1, 0, "MIG-a"),)}


def test_a_document_is_current_until_the_watch_delivers_a_newer_revision() -> None:
    views = Views()
    assert not views.current(0, 5)  # nothing is current before the watch's replay
    views.saw(0, 5)
    views.replayed()
    assert views.current(0, 5)
    assert views.current(0, 6)  # this process's own write, not delivered yet
    assert not views.current(0, 4)
    views.saw(0, 7)
    assert not views.current(0, 6)
    assert views.current(1, 0)  # a card without a document: none was delivered


def test_a_lost_watch_makes_nothing_current_until_its_next_replay() -> None:
    views = Views()
    views.replayed()
    views.enumerated(views.stamp(), SOME)
    views.lost()
    assert not views.current(0, 0)
    assert views.instances() is None
    views.replayed()
    assert views.current(0, 0)


def test_an_enumeration_is_stale_after_any_move_during_or_after_it() -> None:
    views = Views()
    views.replayed()
    stamp = views.stamp()
    views.enumerated(stamp, SOME)
    assert views.instances() == SOME
    views.saw(0, 3)  # the reclaimer's removal after its destroy
    assert views.instances() is None

    stamp = views.stamp()
    views.changed_hardware()  # a create of ours while the enumeration ran
    views.enumerated(stamp, SOME)
    assert views.instances() is None

    views.enumerated(views.stamp(), SOME)
    views.saw(0, 3)  # a revision delivered again (a reset's replay) moves nothing
    assert views.instances() == SOME
    views.enumerated(views.stamp(), None)  # a failed enumeration drops it (invariant 9)
    assert views.instances() is None


EVENTS = st.lists(st.one_of(
    st.tuples(st.just("saw"), st.integers(0, 2), st.integers(0, 20)),
    st.tuples(st.just("hardware")),
    st.tuples(st.just("lost")),
    st.tuples(st.just("replayed")),
    st.tuples(st.just("enumerate"), st.booleans()),
), max_size=40)


@given(EVENTS)
def test_the_views_offer_only_an_enumeration_nothing_has_moved_since(events: list[tuple]) -> None:
    """Against a model: the enumeration offered is the last successful one, taken while the watch
    was loaded, with no newer claim revision, no own driver change and no lost watch since."""
    views = Views()
    newest: dict[int, int] = {}
    loaded = False
    offered: Enumeration | None = None  # the model's answer
    for n, event in enumerate(events):
        if event[0] == "saw":
            _, card, revision = event
            views.saw(card, revision)
            if revision > newest.get(card, 0):
                newest[card] = revision
                offered = None
        elif event[0] == "hardware":
            views.changed_hardware()
            offered = None
        elif event[0] == "lost":
            views.lost()
            loaded, offered = False, None
        elif event[0] == "replayed":
            views.replayed()
            loaded = True
        else:
            found: Enumeration = {0: (Instance(0, "1g.10gb", 0, 1, n, 0, f"MIG-{n}"),)}
            views.enumerated(views.stamp(), found if event[1] else None)
            offered = found if event[1] else None
        assert views.instances() == (offered if loaded else None)
        for card, revision in newest.items():
            assert views.current(card, revision) == loaded
            assert not views.current(card, revision - 1)


async def test_a_partition_carved_while_the_views_are_current_is_planned_around(
    nc, node, caplog: pytest.LogCaptureFixture
) -> None:
    """The views still show the card empty (the hardware poll has not run since): the plan on
    them picks the carved slot, the driver refuses the create there, and the Allocate plans again
    on a fresh read instead of refusing or overlapping."""
    caplog.set_level(logging.INFO)
    async with node_stack(nc, node, pod_resources=False,
                          options=replace(FAST, hardware_poll_seconds=3600)) as n:
        carved = n.sim.carve(0, "1g.10gb", 0)  # the slot a plan on an empty card takes
        await n.watcher.add(n.watcher.record("5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b", "a",
                                             {"main": {R1: 1}}))
        await n.allocate(R1, ["1g.10gb-0"])
        [claim] = await n.claims()
        assert claim.state == "active" and claim.start == 1 and claim.instance is not None
        assert {i.uuid for i in await n.instances()} == {carved.uuid, claim.instance.uuid}
    assert any("placement taken meanwhile" in r.getMessage() for r in caplog.records)
