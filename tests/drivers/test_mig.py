"""The MIG algorithm's pure decisions (partkeeper/drivers/mig.py), over every model's tables.

What a library reports is built from profiles.py, with its placements in any order: no header of
NVIDIA, T-Head or Hygon promises one (nvml.h says nothing of the order of
nvmlDeviceGetGpuInstancePossiblePlacements), so order must change no verdict, for any vendor.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partkeeper.drivers import profiles
from partkeeper.drivers.base import Instance, InstanceSpec, PlacementError
from partkeeper.drivers.mig import Catalogue, GiProfile, leftover_at, legal_shape, profile_view

MODELS = sorted(profiles.MODELS)


def _catalogue(model: str, order: st.DataObject) -> Catalogue:
    """What a library agreeing with the tables reports for `model`, each profile's placements
    shuffled, plus one variant the tables do not have."""
    found = []
    for index, p in enumerate(profiles.MODELS[model].profiles.values()):
        spots = tuple(order.draw(st.permutations(p.placements())))
        found.append(GiProfile(p.name, index, p.compute_slices, len(spots), spots, p))
    found.append(GiProfile("1g.5gb+me", 99, 1, 1, ((0, 1),), None))
    return Catalogue(model, tuple(found))


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(MODELS), start=st.integers(-1, 9), data=st.data())
def test_a_start_is_legal_exactly_where_the_tables_say_whatever_the_order(
    model: str, start: int, data: st.DataObject
) -> None:
    cat = _catalogue(model, data)
    ours = data.draw(st.sampled_from(sorted(profiles.MODELS[model].profiles.values(),
                                            key=lambda p: p.name)))
    spec = InstanceSpec(0, ours.name, start)
    if start in ours.starts:
        chosen, table = legal_shape(spec, cat, "HGML")
        assert (chosen.name, table) == (ours.name, ours)
    else:
        with pytest.raises(PlacementError, match=f"not a legal placement of {ours.name}"):
            legal_shape(spec, cat, "HGML")


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(MODELS), data=st.data())
def test_the_probe_view_matches_the_tables_whatever_the_order(
    model: str, data: st.DataObject
) -> None:
    """Before there was one algorithm, the T-Head and Hygon views compared placements as lists."""
    views = [profile_view(p) for p in _catalogue(model, data).profiles]
    assert all(v["matches"] and v["offered"] for v in views if v["name"] != "1g.5gb+me")
    (variant,) = [v for v in views if v["name"] == "1g.5gb+me"]
    assert variant["matches"] is None and not variant["offered"]


def test_a_variant_or_an_unknown_card_is_refused_with_what_it_offers() -> None:
    cat = Catalogue("H100-80GB", (GiProfile("1g.5gb+me", 99, 1, 1, ((0, 1),), None),))
    with pytest.raises(PlacementError, match=r"offers no GPU-instance profile '1g.5gb\+me' "
                       r"through NVML \(offers none\)"):
        legal_shape(InstanceSpec(0, "1g.5gb+me", 0), cat, "NVML")
    refused = Catalogue(None, cat.profiles, "H100-80GB: NVML offers no 7g.80gb")
    with pytest.raises(PlacementError, match=r"NVML offers no 7g\.80gb"):
        legal_shape(InstanceSpec(0, "1g.10gb", 0), refused, "NVML")


def test_only_a_gpu_instance_without_compute_instance_at_the_spec_is_a_leftover() -> None:
    spec = InstanceSpec(0, "1g.10gb", 2)
    half = Instance(0, "1g.10gb", 2, 1, 9, -1, "")
    whole = Instance(0, "1g.10gb", 2, 1, 9, 0, "MIG-x")
    elsewhere = Instance(0, "1g.10gb", 3, 1, 10, -1, "")
    assert leftover_at(spec, [whole, elsewhere]) is None
    assert leftover_at(spec, [elsewhere, half]) == half
