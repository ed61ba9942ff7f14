"""Patch documents applied to stored objects: JSON merge patch and JSON patch.

Strategic merge patch is applied as a JSON merge patch. The two differ only for lists with merge
keys (a strategic patch of `status.conditions` merges by `type`; a merge patch replaces the list),
which is documented in docs/sim-apiserver.md; callers that need list merging send whole lists.
"""

from __future__ import annotations

from typing import Any

from .clone import clone
from .errors import BadRequest, Invalid, UnsupportedMediaType

MERGE_TYPES = frozenset({"application/merge-patch+json", "application/strategic-merge-patch+json"})
JSON_PATCH_TYPE = "application/json-patch+json"


def apply(content_type: str, original: dict[str, Any], patch: Any) -> dict[str, Any]:
    """The object after `patch`; `original` is left untouched."""
    media = content_type.split(";")[0].strip().lower()
    if media in MERGE_TYPES:
        if not isinstance(patch, dict):
            raise BadRequest("a merge patch must be a JSON object")
        return merge(original, patch)
    if media == JSON_PATCH_TYPE:
        if not isinstance(patch, list):
            raise BadRequest("a JSON patch must be a list of operations")
        return json_patch(original, patch)
    raise UnsupportedMediaType(f"the body of the request was in an unknown format - {media}")


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def json_patch(original: dict[str, Any], operations: list[Any]) -> dict[str, Any]:
    """RFC 6902 operations: add, remove, replace, move, copy, test."""
    document: Any = clone(original)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise BadRequest(f"invalid JSON patch operation: {operation!r}")
        document = _apply_operation(document, operation)
    return document


def _apply_operation(document: Any, operation: dict[str, Any]) -> Any:
    op, path = operation["op"], _pointer(operation["path"])
    if op in ("add", "replace", "test") and "value" not in operation:
        raise BadRequest(f"JSON patch operation {op} needs a value")
    if op == "add":
        return _put(document, path, clone(operation["value"]), insert=True)
    if op == "replace":
        _get(document, path)
        return _put(document, path, clone(operation["value"]), insert=False)
    if op == "remove":
        return _remove(document, path)
    if op == "test":
        if _get(document, path) != operation["value"]:
            raise Invalid(f"JSON patch test failed at {operation['path']}")
        return document
    if op in ("move", "copy"):
        source = _pointer(operation.get("from", ""))
        value = clone(_get(document, source))
        if op == "move":
            document = _remove(document, source)
        return _put(document, path, value, insert=True)
    raise BadRequest(f"unknown JSON patch operation {op!r}")


def _pointer(text: Any) -> list[str]:
    if not isinstance(text, str) or (text and not text.startswith("/")):
        raise BadRequest(f"invalid JSON pointer {text!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in text.split("/")[1:]]


def _container(document: Any, path: list[str]) -> Any:
    return _get(document, path[:-1])


def _get(document: Any, path: list[str]) -> Any:
    node = document
    for part in path:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise Invalid(f"JSON patch path /{'/'.join(path)} does not exist")
    return node


def _put(document: Any, path: list[str], value: Any, *, insert: bool) -> Any:
    if not path:
        return value
    parent, key = _container(document, path), path[-1]
    if isinstance(parent, dict):
        parent[key] = value
    elif isinstance(parent, list):
        index = len(parent) if key == "-" else _index(parent, key, insert)
        if insert:
            parent.insert(index, value)
        else:
            parent[index] = value
    else:
        raise Invalid(f"JSON patch path /{'/'.join(path)} has no container")
    return document


def _remove(document: Any, path: list[str]) -> Any:
    if not path:
        raise Invalid("JSON patch cannot remove the whole document")
    parent, key = _container(document, path), path[-1]
    if isinstance(parent, dict) and key in parent:
        del parent[key]
    elif isinstance(parent, list):
        del parent[_index(parent, key, False)]
    else:
        raise Invalid(f"JSON patch path /{'/'.join(path)} does not exist")
    return document


def _index(items: list[Any], key: str, insert: bool) -> int:
    limit = len(items) if insert else len(items) - 1
    if not key.isdigit() or int(key) > limit:
        raise Invalid(f"JSON patch index {key!r} is out of range")
    return int(key)
