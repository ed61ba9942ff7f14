"""partkeeper.workdir: names, atomic writes, and deletion that never follows a link or a mount."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partkeeper import workdir
from partkeeper.workdir import InvalidName, UnsafePath
from tests_support.gc import device_seam

BAD_UIDS = [
    "", ".", "..", "../etc", "a/b", "/abs", "0B6F4A1E-2C3D-4E5F-8A9B-0C1D2E3F4A5B",
    "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b\n", "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b/..",
    "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5", "0b6f4a1e\x002c3d-4e5f-8a9b-0c1d2e3f4a5b",
    "0b6f4a1e.2c3d-4e5f-8a9b-0c1d2e3f4a5b", "pk.pods.*", 42, None,
]
BAD_CONTAINERS = ["", ".", "..", "../x", "a/b", "Main", "a_b", "-a", "a-", "a" * 64, "c.d", 7]
BAD_MIG = ["", ".", "..", "../x", "MIG-GPU-8f3e/1/0", ".hidden", "a\x00b", "a b", "m" * 129]
GOOD_UID = "0b6f4a1e-2c3d-4e5f-8a9b-0c1d2e3f4a5b"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- names --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_UIDS)
def test_a_bad_uid_is_refused_before_any_path_exists(root: Path, bad: object) -> None:
    with pytest.raises(InvalidName, match="refusing to build a path"):
        workdir.write_descriptor(root, bad, "main", "MIG-1", b"{}")  # type: ignore[arg-type]  # bad input on purpose
    with pytest.raises(InvalidName):
        workdir.pod_dir(root, bad)  # type: ignore[arg-type]  # bad input on purpose
    with pytest.raises(InvalidName):
        workdir.scan_pod(root, bad)  # type: ignore[arg-type]  # bad input on purpose
    with pytest.raises(InvalidName):
        workdir.collect_sliced(root, bad, "main")  # type: ignore[arg-type]  # bad input on purpose
    assert not root.exists()


@pytest.mark.parametrize("bad", BAD_CONTAINERS)
def test_a_container_name_must_be_a_dns_label(root: Path, bad: object) -> None:
    with pytest.raises(InvalidName, match="DNS-1123"):
        workdir.write_sliced(root, GOOD_UID, bad, {})  # type: ignore[arg-type]  # bad input on purpose
    assert not root.exists()


@pytest.mark.parametrize("bad", BAD_MIG)
def test_a_mig_uuid_must_be_one_safe_file_name(root: Path, bad: str) -> None:
    with pytest.raises(InvalidName, match="MIG UUID"):
        workdir.write_descriptor(root, GOOD_UID, "main", bad, b"{}")
    with pytest.raises(InvalidName):
        workdir.remove_descriptor(root, GOOD_UID, "main", bad)
    assert not root.exists()


@pytest.mark.parametrize("bad", ["../x", ".partkeeper-owned", "a/b", "", "cache"])
def test_sliced_file_names_are_checked(root: Path, bad: str) -> None:
    with pytest.raises(InvalidName):
        workdir.write_sliced(root, GOOD_UID, "main", {bad: b"x"})
    assert not root.exists()


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(uid=st.text(max_size=40), container=st.text(max_size=70), token=st.text(max_size=140))
def test_a_built_path_never_leaves_the_root(uid: str, container: str, token: str) -> None:
    root = Path("/srv/pods")
    try:
        path = workdir.descriptor_path(root, uid, container, token)
    except InvalidName:
        return
    assert path.parent.parent.parent == root
    assert path.parts[-3:] == (uid, f"c-{container}", f"partition-{token}.json")
    assert ".." not in path.parts and "/" not in uid + container + token


# --- writing ------------------------------------------------------------------------------------

def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record what each os.fsync synced ("file" or "dir") and let it through."""
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_a_descriptor_costs_no_fsync(
    root: Path, uid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Allocate path's descriptor is renamed into place, not synced: what it describes does
    not outlive a power loss and nothing reads its body after one (docs/gc.md, "Durability of
    the files"). A sync added back is two disk flushes per Allocate."""
    synced = _count_fsyncs(monkeypatch)
    workdir.write_descriptor(root, uid, "main", "MIG-abc", b'{"v": 1}')
    assert synced == []


def test_sliced_files_are_synced_before_they_count(
    root: Path, uid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mark and the limiter files outlive a reboot with the Pod (a logical slice is a share
    of a card, which survives it): each is on disk, file and name, before the reply."""
    synced = _count_fsyncs(monkeypatch)
    workdir.write_sliced(root, uid, "worker-1", {"limits.json": b"{}"}, cache_dir="cc")
    assert synced == ["file", "dir", "file", "dir"]  # the mark, then limits.json



def test_descriptor_is_written_atomically_with_narrow_modes(root: Path, uid: str) -> None:
    path = workdir.write_descriptor(root, uid, "main", "MIG-abc", b'{"v": 1}')
    assert path == root / uid / "c-main" / "partition-MIG-abc.json"
    assert path.read_bytes() == b'{"v": 1}'
    workdir.write_descriptor(root, uid, "main", "MIG-abc", b'{"v": 2}')
    assert path.read_bytes() == b'{"v": 2}'
    assert os.listdir(path.parent) == [path.name]  # no temp file left behind
    assert (mode(root / uid), mode(path.parent), mode(path)) == (0o750, 0o750, 0o640)


def test_sliced_tree_carries_the_exact_mark(root: Path, uid: str) -> None:
    sliced = workdir.write_sliced(root, uid, "worker-1", {"limits.json": b"{}"}, cache_dir="cc")
    assert sliced == workdir.sliced_dir(root, uid, "worker-1")
    mark = json.loads((sliced / ".partkeeper-owned").read_bytes())
    assert mark == {"owner": "partkeeper-allocator", "pod_uid": uid, "container": "worker-1"}
    assert sorted(os.listdir(sliced)) == [".partkeeper-owned", "cc", "limits.json"]
    # The cache dir is the container's to write, whatever its user (HAMi-core's cache file).
    assert (mode(sliced), mode(sliced / "cc"), mode(sliced / "limits.json")) == (
        0o750, 0o777, 0o640)
    assert workdir.scan_pod(root, uid).containers[0].sliced == "owned"


def test_remove_descriptor_removes_only_that_file_then_empty_dirs(root: Path, uid: str) -> None:
    workdir.write_descriptor(root, uid, "main", "MIG-a", b"{}")
    workdir.write_descriptor(root, uid, "main", "MIG-b", b"{}")
    workdir.write_sliced(root, uid, "side", {"limits.json": b"{}"})
    assert workdir.remove_descriptor(root, uid, "main", "MIG-a")
    assert os.listdir(root / uid / "c-main") == ["partition-MIG-b.json"]
    assert workdir.remove_descriptor(root, uid, "main", "MIG-b")
    assert not (root / uid / "c-main").exists()
    assert (root / uid / "c-side" / "sliced").is_dir()  # the slice is the GC's, never ours
    assert not workdir.remove_descriptor(root, uid, "main", "MIG-b")
    assert not workdir.remove_descriptor(root, uid, "other", "MIG-b")


def test_remove_last_descriptor_removes_the_pod_dir(root: Path, uid: str) -> None:
    workdir.write_descriptor(root, uid, "main", "MIG-a", b"{}")
    assert workdir.remove_descriptor(root, uid, "main", "MIG-a")
    assert os.listdir(root) == []


# --- symlinks at every level --------------------------------------------------------------------

LEVELS = ["pod", "container", "sliced"]


def plant_dir_link(root: Path, uid: str, level: str, outside: Path) -> Path:
    """Replace the directory at `level` with a symlink to `outside`."""
    parts = {"pod": (uid,), "container": (uid, "c-main"), "sliced": (uid, "c-main", "sliced")}
    link = root.joinpath(*parts[level])
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    return link


@pytest.mark.parametrize("level", LEVELS)
def test_writers_refuse_a_symlinked_directory(
    root: Path, uid: str, outside: Path, outside_intact: Callable[[], bool], level: str
) -> None:
    plant_dir_link(root, uid, level, outside)
    with pytest.raises(UnsafePath, match="symbolic link"):
        workdir.write_sliced(root, uid, "main", {"limits.json": b"{}"})
    if level != "sliced":
        with pytest.raises(UnsafePath, match="symbolic link"):
            workdir.write_descriptor(root, uid, "main", "MIG-a", b"{}")
        with pytest.raises(UnsafePath):
            workdir.remove_descriptor(root, uid, "main", "MIG-a")
    assert sorted(os.listdir(outside)) == ["cache", "precious.txt"] and outside_intact()


@pytest.mark.parametrize("level", LEVELS)
def test_collection_refuses_a_symlinked_directory(
    root: Path, uid: str, outside: Path, outside_intact: Callable[[], bool], level: str
) -> None:
    # Make the outside tree look exactly like ours, mark included: only the link gives it away.
    (outside / ".partkeeper-owned").write_bytes(workdir.mark_body(uid, "main"))
    plant_dir_link(root, uid, level, outside)
    result = workdir.collect_sliced(root, uid, "main")
    assert result.files == 0 and result.removed == []
    assert [reason for _, reason in result.left] == ["is a symbolic link; refusing to follow it"]
    workdir.remove_empty(root, uid, ["c-main"])
    assert outside_intact() and (outside / ".partkeeper-owned").exists()
    listing = workdir.scan_pod(root, uid)
    if level == "pod":
        assert listing.state == "unsafe"
    elif level == "container":
        assert listing.others == (workdir.Entry("c-main", "symlink"),)
    else:
        assert listing.containers[0].sliced == "unsafe"


@pytest.mark.parametrize("inside", ["limits.json", "cache/kernel.bin", "cache", "cache/sub"])
def test_a_symlink_inside_sliced_is_left_and_not_followed(
    root: Path, uid: str, outside: Path, outside_intact: Callable[[], bool], inside: str
) -> None:
    sliced = workdir.write_sliced(root, uid, "main", {"limits.json": b"{}"})
    link = sliced / inside
    if link.exists():
        link.unlink() if link.is_file() else link.rmdir()
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside / "precious.txt" if "." in inside else outside)
    result = workdir.collect_sliced(root, uid, "main")
    where = str(Path(uid, "c-main", "sliced", inside))
    assert (where, "is a symlink; left in place") in result.left
    assert link.is_symlink() and (sliced / ".partkeeper-owned").exists()
    assert outside_intact()


def test_a_symlinked_descriptor_is_replaced_not_written_through(
    root: Path, uid: str, outside: Path, outside_intact: Callable[[], bool]
) -> None:
    (root / uid / "c-main").mkdir(parents=True)
    link = root / uid / "c-main" / "partition-MIG-a.json"
    link.symlink_to(outside / "precious.txt")
    with pytest.raises(UnsafePath, match="not a regular file"):
        workdir.remove_descriptor(root, uid, "main", "MIG-a")
    assert link.is_symlink()
    workdir.write_descriptor(root, uid, "main", "MIG-a", b"{}")
    assert not link.is_symlink() and link.read_bytes() == b"{}"
    assert outside_intact()


@pytest.mark.parametrize(
    "mark",
    [
        b"",
        b"not json",
        b'{"owner": "someone-else", "pod_uid": "%(uid)s", "container": "main"}',
        b'{"owner": "partkeeper-allocator", "pod_uid": "%(other)s", "container": "main"}',
        b'{"owner": "partkeeper-allocator", "pod_uid": "%(uid)s", "container": "side"}',
        b'{"owner": "partkeeper-allocator", "pod_uid": "%(uid)s", "container": "main", "x": 1}',
        b" " * 5000,
    ],
)
def test_a_foreign_or_malformed_mark_is_not_ours(root: Path, uid: str, mark: bytes) -> None:
    sliced = workdir.write_sliced(root, uid, "main", {"limits.json": b"{}"})
    other = "ffffffff-2c3d-4e5f-8a9b-0c1d2e3f4a5b"
    body = mark % {b"uid": uid.encode(), b"other": other.encode()}
    (sliced / ".partkeeper-owned").write_bytes(body)
    assert workdir.scan_pod(root, uid).containers[0].sliced == "bad-mark"
    result = workdir.collect_sliced(root, uid, "main")
    assert result.files == 0 and (sliced / "limits.json").exists()


@pytest.mark.parametrize("kind", ["missing", "fifo", "dir", "symlink"])
def test_a_mark_that_is_not_a_regular_file_is_not_ours(root: Path, uid: str, kind: str) -> None:
    sliced = workdir.write_sliced(root, uid, "main", {"limits.json": b"{}"})
    mark = sliced / ".partkeeper-owned"
    body = mark.read_bytes()
    mark.unlink()
    if kind == "fifo":
        os.mkfifo(mark)
    elif kind == "dir":
        mark.mkdir()
    elif kind == "symlink":
        (sliced.parent / "elsewhere").write_bytes(body)
        mark.symlink_to(sliced.parent / "elsewhere")
    expected = "unmarked" if kind == "missing" else "bad-mark"
    assert workdir.scan_pod(root, uid).containers[0].sliced == expected
    assert workdir.collect_sliced(root, uid, "main").files == 0
    assert (sliced / "limits.json").exists()


# --- another filesystem -------------------------------------------------------------------------


@pytest.mark.parametrize("level", [*LEVELS, "cache"])
def test_another_filesystem_is_not_entered_seam(
    root: Path, uid: str, level: str
) -> None:
    sliced = workdir.write_sliced(root, uid, "main", {"limits.json": b"{}"})
    (sliced / "cache" / "blob").write_bytes(b"x")
    where = {"pod": root / uid, "container": sliced.parent, "sliced": sliced}.get(
        level, sliced / "cache"
    )
    device_of = device_seam(where)
    result = workdir.collect_sliced(root, uid, "main", device_of=device_of)
    assert any("another filesystem" in reason for _, reason in result.left)
    assert (sliced / "cache" / "blob").exists()
    if level == "cache":
        assert result.files == 1 and (sliced / ".partkeeper-owned").exists()
    else:
        assert result.files == 0 and (sliced / "limits.json").exists()


def test_a_real_tmpfs_is_not_entered(
    root: Path, uid: str, mount_tmpfs: Callable[[Path], Path]
) -> None:
    sliced = workdir.write_sliced(root, uid, "main", {"limits.json": b"{}"})
    mounted = mount_tmpfs(sliced / "cache")
    (mounted / "blob").write_bytes(b"on another filesystem")
    result = workdir.collect_sliced(root, uid, "main")
    why = "is on another filesystem; left in place"
    assert result.left == [(f"{uid}/c-main/sliced/cache", why)]
    assert (mounted / "blob").read_bytes() == b"on another filesystem"
    assert not (sliced / "limits.json").exists() and (sliced / ".partkeeper-owned").exists()


def test_a_pod_dir_that_is_a_mount_point_is_refused(
    root: Path, uid: str, mount_tmpfs: Callable[[Path], Path]
) -> None:
    root.mkdir()
    mounted = mount_tmpfs(root / uid)
    with pytest.raises(UnsafePath, match="another filesystem"):
        workdir.write_descriptor(root, uid, "main", "MIG-a", b"{}")
    assert workdir.scan_pod(root, uid).state == "unsafe"
    assert os.listdir(mounted) == []


# --- scanning and collecting --------------------------------------------------------------------


def test_scan_classifies_every_entry(root: Path, uid: str) -> None:
    workdir.write_descriptor(root, uid, "main", "MIG-a", b"{}")
    workdir.write_sliced(root, uid, "main", {"limits.json": b"{}"})
    (root / uid / "c-main" / "notes.txt").write_bytes(b"?")
    (root / uid / "c-Bad").mkdir()
    (root / uid / "stray").write_bytes(b"?")
    (root / "not-a-uid").mkdir()
    (root / "README").write_bytes(b"?")
    scan = workdir.scan_root(root)
    assert scan.others == (workdir.Entry("README", "file"), workdir.Entry("not-a-uid", "dir"))
    (pod,) = scan.pods
    assert pod.others == (workdir.Entry("c-Bad", "dir"), workdir.Entry("stray", "file"))
    assert pod.containers == (
        workdir.ContainerListing(
            "c-main", "main", ("partition-MIG-a.json",), "owned",
            (workdir.Entry("notes.txt", "file"),),
        ),
    )


def test_a_missing_root_scans_as_empty(root: Path, uid: str) -> None:
    assert workdir.scan_root(root) == workdir.RootScan((), ())
    assert workdir.scan_pod(root, uid).state == "absent"
    assert workdir.collect_sliced(root, uid, "main") == workdir.Purge()


def test_collect_deletes_the_owned_tree_and_nothing_beside_it(root: Path, uid: str) -> None:
    workdir.write_descriptor(root, uid, "main", "MIG-a", b"{}")
    sliced = workdir.write_sliced(root, uid, "main", {"limits.json": b"{}", "cuda.env": b""})
    (sliced / "cache" / "deep" / "deeper").mkdir(parents=True)
    (sliced / "cache" / "deep" / "deeper" / "x").write_bytes(b"x")
    result = workdir.collect_sliced(root, uid, "main")
    assert result.left == [] and result.files == 4  # two files, one cached, and the mark
    assert result.removed[-1] == f"{uid}/c-main/sliced"
    assert os.listdir(root / uid / "c-main") == ["partition-MIG-a.json"]
    empty = workdir.remove_empty(root, uid, ["c-main"])
    assert empty.removed == [] and (root / uid / "c-main" / "partition-MIG-a.json").exists()


def test_remove_empty_removes_only_empty_dirs(root: Path, uid: str) -> None:
    (root / uid / "c-a").mkdir(parents=True)
    (root / uid / "c-b").mkdir()
    (root / uid / "c-b" / "x").write_bytes(b"")
    result = workdir.remove_empty(root, uid, ["c-a", "c-b", "../x"])
    assert result.removed == [f"{uid}/c-a"]
    assert (f"{uid}/../x", "not a container directory name") in result.left
    (root / uid / "c-b" / "x").unlink()
    assert workdir.remove_empty(root, uid, ["c-b"]).removed == [f"{uid}/c-b", uid]
