"""Kubernetes quantities (`resource.Quantity`) as exact numbers, and their canonical spelling.

The API server stores and returns every quantity of a ResourceSlice in canonical form
(k8s.io/apimachinery pkg/api/resource/quantity.go, `CanonicalizeBytes`): a binary-suffixed value
takes the largest power-of-1024 suffix that keeps it whole (`10240Mi` -> `10Gi`), a decimal one
the largest power-of-1000 suffix (`1000` -> `1k`, `1500` stays), and a binary value under 1024
is written decimally (`512` stays `512`, but `0.5Ki` -> `512`). So what a driver sent and what
the server answers may differ in spelling only: compare `parse(a) == parse(b)`, never strings.

Exponent forms (`1e3`) and rounding beyond the suffixes are outside what partkeeper writes or
reads, and are refused with a `ValueError` naming the text.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

_TEXT = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


# A slice repeats the same few spellings (every partition's memory, every card's counters) and
# each pass compares or canonicalises all of them: the exact arithmetic is done once per text.
_CACHED = 4096


@functools.lru_cache(maxsize=_CACHED)
def _split_text(text: str) -> tuple[Fraction, str]:
    match = _TEXT.match(text)
    if match is None:
        raise ValueError(f"quantity {text!r} is not a number with an optional SI or binary "
                         "suffix")
    number = Fraction(match[2]) * (-1 if match[1] == "-" else 1)
    return number, match[3] or ""


def parse(text: object) -> Fraction:
    """The exact value of a quantity. Raises ValueError."""
    return _parse_text(str(text).strip())


@functools.lru_cache(maxsize=_CACHED)
def _parse_text(text: str) -> Fraction:
    number, suffix = _split_text(text)
    if suffix in _BINARY:
        return number * 1024 ** _BINARY[suffix]
    return number * Fraction(10) ** _DECIMAL[suffix]


def canonical(text: object) -> str:
    """The spelling the API server answers with for `text`. Raises ValueError."""
    return _canonical_text(str(text).strip())


@functools.lru_cache(maxsize=_CACHED)
def _canonical_text(text: str) -> str:
    value = _parse_text(text)
    _, suffix = _split_text(text)
    if suffix in _BINARY and abs(value) >= 1024 and value.denominator == 1:
        power = 0
        while power < 6 and value.numerator % 1024 ** (power + 1) == 0:
            power += 1
        names = {v: k for k, v in _BINARY.items()}
        return f"{value.numerator // 1024 ** power}{names.get(power, '')}"
    return _decimal(value)


def _decimal(value: Fraction) -> str:
    if value == 0:
        return "0"
    for suffix, exponent in sorted(_DECIMAL.items(), key=lambda item: -item[1]):
        mantissa = value / Fraction(10) ** exponent
        if mantissa.denominator == 1:
            return f"{mantissa.numerator}{suffix}"
    raise ValueError(f"quantity {value} is finer than a nano unit")
