"""Fuzzing the path handling of PK_PODS_DIR (partkeeper.workdir): no Pod UID, container name or
MIG UUID that is accepted builds a path outside the root, or at another depth than the layout's;
everything else is refused with InvalidName. Then the same names through the real calls that
write and remove, on a real directory: nothing appears outside the root."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from partkeeper import workdir
from partkeeper.workdir import InvalidName, WorkdirError

pytestmark = pytest.mark.reliability

ROOT = Path("/var/lib/partkeeper/pods")
FUZZ = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

tricky = st.sampled_from(["", ".", "..", "../x", "a/b", "/abs", "a\x00b", "~", "c-..", " ",
                          "..\\x", "%2e%2e", "\u2025", "a/../../b", "-", "x" * 300])
names = st.text(max_size=64) | tricky | st.from_regex(r"[a-z0-9.\-_/]{1,70}", fullmatch=True)
uids = names | st.builds(lambda u: str(u), st.uuids()) | st.builds(lambda u: str(u).upper(),
                                                                   st.uuids())


def inside(path: Path, root: Path, depth: int) -> bool:
    """`path` is exactly `depth` plain components below `root` (no '.', '..', no empty part)."""
    rel = os.path.relpath(os.path.normpath(path), root)
    parts = Path(rel).parts
    return (os.path.normpath(path) == str(path) and len(parts) == depth
            and all(p not in ("", ".", "..") and "/" not in p and "\x00" not in p
                    for p in parts))


@FUZZ
@given(uid=uids, container=names, mig=names)
def test_accepted_names_stay_under_the_root(uid: str, container: str, mig: str) -> None:
    builders = [
        (lambda: workdir.pod_dir(ROOT, uid), 1),
        (lambda: workdir.container_dir(ROOT, uid, container), 2),
        (lambda: workdir.sliced_dir(ROOT, uid, container), 3),
        (lambda: workdir.descriptor_path(ROOT, uid, container, mig), 3),
    ]
    for build, depth in builders:
        try:
            path = build()
        except InvalidName:
            continue
        assert inside(path, ROOT, depth), f"{path} escapes {ROOT} or has the wrong depth"


@FUZZ
@given(uid=uids, container=names, mig=names)
def test_writes_and_removals_never_leave_the_root(tmp_path: Path, uid: str, container: str,
                                                   mig: str) -> None:
    root = tmp_path / f"r{uuid.uuid4().hex[:8]}" / "pods"
    root.parent.mkdir()
    outside_before = set(os.listdir(root.parent))
    try:
        workdir.write_descriptor(root, uid, container, mig, b"{}")
        workdir.remove_descriptor(root, uid, container, mig)
    except WorkdirError:
        pass  # refused (InvalidName, UnsafePath): nothing written; checked below
    assert set(os.listdir(root.parent)) <= outside_before | {"pods"}
    for dirpath, dirnames, filenames in os.walk(root.parent):
        for entry in dirnames + filenames:
            assert inside(Path(dirpath) / entry, root.parent,
                          len((Path(dirpath) / entry).relative_to(root.parent).parts))
            assert (Path(dirpath) / entry).resolve().is_relative_to(root.parent.resolve())


@given(container=st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True))
def test_every_dns_label_container_is_accepted(container: str) -> None:
    uid = str(uuid.uuid4())
    assume(container)
    assert workdir.container_dir(ROOT, uid, container) == ROOT / uid / f"c-{container}"
