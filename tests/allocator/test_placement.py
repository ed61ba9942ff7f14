"""Placement and capacity as pure functions: tables for the rules, hypothesis for the guarantees."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partkeeper.drivers import Card, Instance, Mode
from partkeeper.drivers.profiles import max_instances, model, overlaps
from services.allocator.core import capacity, catalog
from services.allocator.core.placement import Spot, covered, place
from tests_support import make_claim

H100 = model("H100-80GB").profiles
LEGAL_1G = H100["1g.10gb"].placements()  # size 1 at 0..6
LEGAL_3G = H100["3g.40gb"].placements()  # size 4 at 0, 4
LEGAL_7G = H100["7g.80gb"].placements()  # size 8 at 0


def inst(card: int, start: int, size: int, gi: int = 1) -> Instance:
    return Instance(card, f"x{size}", start, size, gi, 0, f"MIG-{card}-{start}-{gi}")


@pytest.mark.parametrize(
    ("legal", "claims", "instances", "expected"),
    [
        pytest.param({0: LEGAL_1G, 1: LEGAL_1G}, [], [], [Spot(0, 0, 1)],
                     id="empty: card 0, start 0"),
        pytest.param({0: LEGAL_1G, 1: LEGAL_1G}, [make_claim("a", 0, 1, card=1)], [],
                     [Spot(1, 1, 1)], id="most occupied card wins"),
        pytest.param({0: LEGAL_1G, 1: LEGAL_1G}, [], [inst(1, 3, 2)],
                     [Spot(1, 0, 1)], id="a foreign instance makes its card the most occupied"),
        pytest.param({0: LEGAL_3G, 1: LEGAL_3G}, [make_claim("a", 0, 4)], [inst(0, 4, 1)],
                     [Spot(1, 0, 4)], id="most occupied card does not fit: next"),
        pytest.param({0: LEGAL_3G}, [make_claim("a", 0, 4, state="releasing")], [],
                     [Spot(0, 4, 4)], id="a releasing claim still covers its slots"),
        pytest.param({0: LEGAL_7G}, [], [inst(0, 6, 1)], None,
                     id="one foreign slice blocks the whole-card profile"),
        pytest.param({0: LEGAL_1G, 1: LEGAL_1G}, [make_claim("a", 2, 1), make_claim("b", 0, 1,
                     card=1)], [], [Spot(0, 0, 1)], id="tie on occupation: lowest card index"),
        pytest.param({0: LEGAL_1G}, [make_claim("a", 0, 1), make_claim("b", 2, 1)], [],
                     [Spot(0, 1, 1)], id="lowest free legal start"),
    ],
)
def test_place_table(legal, claims, instances, expected) -> None:
    assert place(legal, claims, instances) == expected


def test_place_several_packs_one_card() -> None:
    spots = place({0: LEGAL_3G, 1: LEGAL_3G}, [], [], count=2)
    assert spots == [Spot(0, 0, 4), Spot(0, 4, 4)]
    assert place({0: LEGAL_3G}, [], [], count=3) is None


def test_slice_claims_do_not_block_partitions_and_the_other_way_round() -> None:
    slice_claim = make_claim("s", 0, 1)
    slice_claim = type(slice_claim)(**{**_fields(slice_claim), "kind": "slice"})
    assert place({0: LEGAL_7G}, [slice_claim], []) == [Spot(0, 0, 8)]
    assert place({0: ((0, 1), (1, 1))}, [make_claim("p", 0, 8)], [inst(0, 0, 8)],
                 kind="slice") == [Spot(0, 0, 1)]


def _fields(claim):
    return {f: getattr(claim, f) for f in claim.__struct_fields__}


# -- hypothesis: guarantees of placement and capacity -----------------------------------------

ranges = st.tuples(st.integers(0, 7), st.integers(1, 8)).filter(lambda r: r[0] + r[1] <= 8)
profiles = st.sampled_from(sorted(H100))


@st.composite
def boards(draw):
    cards = draw(st.integers(1, 3))
    claims = [make_claim(f"c{i}", s, z, card=draw(st.integers(0, cards - 1)))
              for i, (s, z) in enumerate(draw(st.lists(ranges, max_size=5)))]
    instances = [inst(draw(st.integers(0, cards - 1)), s, z, gi=i + 1)
                 for i, (s, z) in enumerate(draw(st.lists(ranges, max_size=4)))]
    return cards, claims, instances


@given(boards(), profiles)
@settings(max_examples=300, deadline=None)
def test_place_never_overlaps_and_follows_the_rule(board, profile) -> None:
    cards, claims, instances = board
    legal = {c: H100[profile].placements() for c in range(cards)}
    taken = {c: [(x.start, x.size) for x in claims if x.card == c]
             + [i.placement for i in instances if i.card == c] for c in range(cards)}
    fits = {c: [r for r in legal[c] if not any(overlaps(r, t) for t in taken[c])]
            for c in range(cards)}
    spots = place(legal, claims, instances)
    if not any(fits.values()):
        assert spots is None
        return
    assert spots is not None and len(spots) == 1
    spot = spots[0]
    assert spot.range in legal[spot.card]
    assert not any(overlaps(spot.range, t) for t in taken[spot.card])  # invariant 5
    best = max(covered(taken[c]) for c in range(cards) if fits[c])
    assert covered(taken[spot.card]) == best
    assert spot.card == min(c for c in range(cards) if fits[c] and covered(taken[c]) == best)
    assert spot.range == min(fits[spot.card])


@given(boards(), profiles, st.sets(st.integers(0, 2)), st.integers(1, 3))
@settings(max_examples=300, deadline=None)
def test_a_failed_card_takes_nothing_and_the_others_place_as_without_it(
    board, profile, failed, count
) -> None:
    """DESIGN.md, "Card health": no Allocate places on a failed card; the healthy cards place
    exactly as they would on a node without it."""
    cards, claims, instances = board
    legal = {c: H100[profile].placements() for c in range(cards)}
    spots = place(legal, claims, instances, count=count, failed=frozenset(failed))
    others = {c: r for c, r in legal.items() if c not in failed}
    assert spots == place(others, [c for c in claims if c.card not in failed],
                          [i for i in instances if i.card not in failed], count=count)
    assert spots is None or not any(s.card in failed for s in spots)


@given(boards(), profiles, st.sets(st.integers(0, 2)))
@settings(max_examples=200, deadline=None)
def test_a_failed_cards_room_counts_for_nothing(board, profile, failed) -> None:
    cards, claims, instances = board
    offer = catalog.offers([card(c, "H100-80GB") for c in range(cards)], prefix="p/",
                           sliced_resource="s", slices_per_card=4)["p/" + profile]
    free = capacity.free_per_card(offer, claims, instances, frozenset(failed))
    whole = capacity.free_per_card(offer, claims, instances)
    assert free == {c: 0 if c in failed else n for c, n in whole.items()}


def brute_force(legal: tuple[tuple[int, int], ...], taken: list[tuple[int, int]]) -> int:
    free = [r for r in legal if not any(overlaps(r, t) for t in taken)]
    for k in range(len(free), 0, -1):
        for combo in combinations(free, k):
            if all(not overlaps(a, b) for a, b in combinations(combo, 2)):
                return k
    return 0


@given(profiles, st.lists(ranges, max_size=4))
@settings(max_examples=300, deadline=None)
def test_placeable_is_the_true_maximum_and_never_counts_a_covered_slot(profile, taken) -> None:
    legal = H100[profile].placements()
    assert capacity.placeable(legal, taken) == brute_force(legal, taken)
    if taken:
        assert capacity.placeable(legal, taken) <= max_instances(H100[profile])


# -- the catalog ----------------------------------------------------------------------------


def card(index: int, model_name: str, mode: Mode = "partition") -> Card:
    return Card(index, f"GPU-{index}", model_name, mode, model(model_name).memory_mib)


def test_catalog_token_counts_and_names() -> None:
    cards = [card(0, "H100-80GB"), card(1, "H100-80GB"), card(2, "A100-40GB", "sliced"),
             card(3, "A100-40GB", "sliced")]
    offers = catalog.offers(cards, prefix="nvidia.com/mig-",
                            sliced_resource="nvidia.com/gpu.sliced", slices_per_card=4)
    assert list(offers)[:2] == ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.20gb"]
    assert len(offers["nvidia.com/mig-1g.10gb"].tokens) == 14
    assert len(offers["nvidia.com/mig-3g.40gb"].tokens) == 4
    assert len(offers["nvidia.com/mig-7g.80gb"].tokens) == 2
    sliced = offers["nvidia.com/gpu.sliced"]
    assert (sliced.kind, sliced.profile, len(sliced.tokens)) == ("slice", "sliced", 8)
    assert sliced.cards == (2, 3)
    assert all(len(t) <= 63 for o in offers.values() for t in o.tokens)


def test_catalog_mixed_models_offer_each_profile_where_it_exists() -> None:
    offers = catalog.offers([card(0, "A100-40GB"), card(1, "H100-80GB")], prefix="x/mig-",
                            sliced_resource="x/sliced", slices_per_card=4)
    assert offers["x/mig-1g.10gb"].cards == (0, 1)  # A100's two-slice 1g and H100's one-slice 1g
    assert offers["x/mig-7g.40gb"].cards == (0,)
    assert "x/sliced" not in offers
