"""Field and label selectors, as the API server parses and applies them.

Field selectors accept `=`, `==` and `!=` on the fields the real server indexes for each
resource; any other field is refused (400), as the real server does, so a typo cannot silently
match everything. Label selectors accept equality, inequality, existence and `in`/`notin` sets.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import resource
from .errors import BadRequest

# Fields each resource can be selected on (the real server's field-label conversions).
FIELDS: dict[str, frozenset[str]] = {
    "pods": frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    "nodes": frozenset({"metadata.name", "spec.unschedulable"}),
    "events": frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    **resource.FIELDS,
}

_LABEL_SET = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_LABEL_OP = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")
_LABEL_EXISTS = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")

Predicate = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True)
class Selector:
    """A parsed fieldSelector plus labelSelector; an empty one matches every object."""

    predicates: tuple[Predicate, ...] = ()

    def matches(self, obj: dict[str, Any]) -> bool:
        return all(predicate(obj) for predicate in self.predicates)


def parse(resource: str, field_selector: str | None, label_selector: str | None) -> Selector:
    predicates = [*_parse_fields(resource, field_selector or "")]
    predicates += _parse_labels(label_selector or "")
    return Selector(tuple(predicates))


def field_value(obj: dict[str, Any], path: str) -> str:
    """The string a field selector compares against: absent fields read as ""."""
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, escaped = [], [], False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _parse_fields(resource: str, text: str) -> list[Predicate]:
    allowed = FIELDS.get(resource, frozenset({"metadata.name", "metadata.namespace"}))
    predicates: list[Predicate] = []
    for term in (t for t in _split_unescaped(text, ",") if t.strip()):
        match = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)(.*)$", term)
        if not match:
            raise BadRequest(f"invalid selector: '{text}'; can't understand '{term}'")
        field, op, value = match.group(1), match.group(2), match.group(3)
        if field not in allowed:
            raise BadRequest(f'field label not supported: "{field}"')
        predicates.append(_field_predicate(field, op == "!=", value))
    return predicates


def _field_predicate(field: str, negate: bool, value: str) -> Predicate:
    return lambda obj: (field_value(obj, field) == value) != negate


def _labels_of(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    return labels if isinstance(labels, dict) else {}


def _split_label_terms(text: str) -> list[str]:
    # Commas inside "in (a,b)" separate values, not requirements.
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [t for t in terms if t.strip()]


def _parse_labels(text: str) -> list[Predicate]:
    predicates: list[Predicate] = []
    for term in _split_label_terms(text):
        predicates.append(_label_predicate(term, text))
    return predicates


def _label_predicate(term: str, text: str) -> Predicate:
    if match := _LABEL_SET.match(term):
        if match.group(1):
            raise BadRequest(f"unable to parse requirement: '{term}'")
        key, negate = match.group(2), match.group(3) == "notin"
        values = frozenset(v.strip() for v in match.group(4).split(",") if v.strip())
        if negate:
            return lambda obj: _labels_of(obj).get(key) not in values
        return lambda obj: key in _labels_of(obj) and _labels_of(obj)[key] in values
    if match := _LABEL_OP.match(term):
        key, op, value = match.groups()
        if op == "!=":
            return lambda obj: _labels_of(obj).get(key) != value
        return lambda obj: key in _labels_of(obj) and _labels_of(obj)[key] == value
    if match := _LABEL_EXISTS.match(term):
        absent, key = bool(match.group(1)), match.group(2)
        return lambda obj: (key in _labels_of(obj)) != absent
    raise BadRequest(f"unable to parse requirement: '{term}' in '{text}'")
