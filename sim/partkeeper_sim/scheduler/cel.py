"""The subset of CEL that device selectors are written in here, evaluated against one device.

Supported: terms joined by `&&`, each `device.driver == "<name>"` or
`device.attributes["<domain>"].<name> == <"string" | int | true | false>` (also `!=`).
Anything else is a `SelectorError`: the simulated scheduler refuses what it cannot evaluate
rather than guess, and says so on the Pod.
"""

from __future__ import annotations

import json
import re
from typing import Any

_DRIVER = re.compile(r'^device\.driver\s*(==|!=)\s*("(?:[^"\\]|\\.)*")$')
_ATTR = re.compile(
    r'^device\.attributes\["([^"]+)"\]\.([A-Za-z][A-Za-z0-9_]*)\s*(==|!=)\s*'
    r'("(?:[^"\\]|\\.)*"|-?\d+|true|false)$'
)


class SelectorError(ValueError):
    """An expression outside the supported subset."""


def _attribute(device: dict[str, Any], driver: str, domain: str, name: str) -> Any:
    attrs = device.get("attributes") or {}
    found = attrs.get(f"{domain}/{name}")
    if found is None and domain == driver:
        found = attrs.get(name)
    if not isinstance(found, dict):
        return None
    for key in ("string", "int", "bool", "version"):
        if key in found:
            return found[key]
    return None


def _term(term: str, device: dict[str, Any], driver: str) -> bool:
    term = term.strip()
    if match := _DRIVER.match(term):
        equal = driver == json.loads(match[2])
        return equal if match[1] == "==" else not equal
    if match := _ATTR.match(term):
        value = _attribute(device, driver, match[1], match[2])
        equal = value is not None and value == json.loads(match[4])
        return equal if match[3] == "==" else not equal
    raise SelectorError(f"selector term {term!r} is outside the CEL subset the simulated "
                        "scheduler evaluates")


def matches(expression: str, device: dict[str, Any], driver: str) -> bool:
    """Whether `device` of `driver` satisfies `expression`. Raises SelectorError."""
    return all(_term(t, device, driver) for t in expression.split("&&"))
