"""Quantities as the API server spells them (apimachinery's canonical form), and by value."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partkeeper.dra import quantity


@pytest.mark.parametrize(("sent", "stored"), [
    ("10240Mi", "10Gi"), ("81920Mi", "80Gi"), ("9856Mi", "9856Mi"), ("1024Ki", "1Mi"),
    ("1000", "1k"), ("1500", "1500"), ("2000000", "2M"), ("1", "1"), ("0", "0"),
    ("512", "512"), ("1024", "1024"), ("0.5Ki", "512"), ("1536", "1536"), ("500m", "500m"),
    ("0.5", "500m"), ("7", "7"), ("1Ki", "1Ki"),
])
def test_canonical_spelling(sent: str, stored: str) -> None:
    assert quantity.canonical(sent) == stored
    assert quantity.parse(sent) == quantity.parse(stored)


@pytest.mark.parametrize("bad", ["", "ten", "1e3", "1 Gi", "1gi", "--1", None])
def test_unreadable_quantities_are_refused(bad) -> None:
    with pytest.raises(ValueError, match="quantity"):
        quantity.parse(bad)


@given(st.integers(min_value=0, max_value=2**50),
       st.sampled_from(["", "k", "M", "Ki", "Mi", "Gi"]))
def test_canonical_keeps_the_value_and_is_stable(number: int, suffix: str) -> None:
    text = f"{number}{suffix}"
    stored = quantity.canonical(text)
    assert quantity.parse(stored) == quantity.parse(text)
    assert quantity.canonical(stored) == stored
    assert isinstance(quantity.parse(stored), Fraction)
