"""The pure pieces of device handoff: /proc/devices as nvidia-modprobe reads it, placements as
sets, and making one node (idempotent, replacing a wrong one, tolerating a concurrent maker)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from fakes.hostfs import char_device
from hypothesis import given
from hypothesis import strategies as st

from partkeeper.devices import CAPS_MODULE, DeviceNodeError, Roots, char_major, ensure_node
from partkeeper.drivers import profiles
from partkeeper.drivers.mig import same_placements

_NAMES = st.sampled_from(["nvidia", "nvidia-caps", "nvidia-caps-imex-channels", "nvidia-uvm",
                          "nvidia-frontend", "mem", "tty", "sd"])
_ENTRIES = st.lists(st.tuples(st.integers(1, 511), _NAMES), max_size=12)


@given(chars=_ENTRIES, blocks=_ENTRIES)
def test_the_caps_major_is_the_character_device_of_exactly_that_name(
    chars: list[tuple[int, str]], blocks: list[tuple[int, str]]
) -> None:
    text = ("Character devices:\n" + "".join(f"{n:3d} {m}\n" for n, m in chars)
            + "\nBlock devices:\n" + "".join(f"{n:3d} {m}\n" for n, m in blocks))
    expected = next((n for n, m in chars if m == CAPS_MODULE), None)  # the first, as modprobe
    with tempfile.TemporaryDirectory(prefix="pk-proc-") as tmp:
        (Path(tmp) / "devices").write_text(text)
        assert char_major(Roots(Path(tmp), Path(tmp)), CAPS_MODULE) == expected


def test_an_unreadable_proc_devices_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DeviceNodeError, match=f"cannot read {tmp_path / 'devices'}"):
        char_major(Roots(tmp_path, tmp_path), CAPS_MODULE)


@given(model=st.sampled_from([m for m in profiles.MODELS.values() if m.vendor == "nvidia"]),
       data=st.data())
def test_placements_agree_in_any_order_and_only_as_the_same_set(
    model: profiles.CardModel, data: st.DataObject
) -> None:
    for profile in model.profiles.values():
        table = profile.placements()
        shuffled = tuple(data.draw(st.permutations(table)))
        assert same_placements(shuffled, table)
        if len(table) > 1:
            assert not same_placements(shuffled[1:], table)  # one placement short
        assert not same_placements((*shuffled, (9, 1)), table)  # one more, past the card


@pytest.fixture
def may_mknod(tmp_path: Path) -> None:
    if not char_device(tmp_path / "probe-node", 1, 3):
        pytest.skip("no CAP_MKNOD here")
    (tmp_path / "probe-node").unlink()


def _char(path: Path) -> tuple[int, int, int]:
    st_ = os.stat(path)
    assert stat.S_ISCHR(st_.st_mode)
    return os.major(st_.st_rdev), os.minor(st_.st_rdev), stat.S_IMODE(st_.st_mode)


def test_making_a_node_is_idempotent_and_replaces_a_wrong_one(
    tmp_path: Path, may_mknod: None
) -> None:
    calls: list[str] = []

    def counted(path: str, mode: int, device: int) -> None:
        calls.append(path)
        os.mknod(path, mode, device)

    roots = Roots(tmp_path, tmp_path, counted)
    old = os.umask(0o077)  # mknod applies it; the file's mode must still be the capability's
    try:
        ensure_node(roots, "/dev/nvidia-caps/nvidia-cap12", 235, 12, 0o444)
        ensure_node(roots, "/dev/nvidia-caps/nvidia-cap12", 235, 12, 0o444)
    finally:
        os.umask(old)
    node = tmp_path / "dev/nvidia-caps/nvidia-cap12"
    assert _char(node) == (235, 12, 0o444) and len(calls) == 1
    ensure_node(roots, "/dev/nvidia-caps/nvidia-cap12", 235, 13, 0o444)  # another minor named
    assert _char(node) == (235, 13, 0o444) and len(calls) == 2


def test_a_node_made_meanwhile_by_another_hand_over_is_taken(
    tmp_path: Path, may_mknod: None
) -> None:
    def raced(path: str, mode: int, device: int) -> None:
        os.mknod(path, mode, device)  # the other Allocate's
        raise FileExistsError(17, "File exists", path)

    ensure_node(Roots(tmp_path, tmp_path, raced), "/dev/nvidia-caps/nvidia-cap4", 235, 4, 0o444)
    assert _char(tmp_path / "dev/nvidia-caps/nvidia-cap4") == (235, 4, 0o444)


def test_a_link_at_the_node_is_replaced_never_followed(tmp_path: Path, may_mknod: None) -> None:
    """A link where the node goes (to a file elsewhere on the host): replaced by the node; the
    file it pointed at keeps its mode and content."""
    elsewhere = tmp_path / "host-file"
    elsewhere.write_text("host")
    elsewhere.chmod(0o600)
    caps = tmp_path / "root/dev/nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "nvidia-cap12").symlink_to(elsewhere)
    ensure_node(Roots(tmp_path / "root", tmp_path), "/dev/nvidia-caps/nvidia-cap12", 235, 12,
                0o444)
    assert _char(caps / "nvidia-cap12") == (235, 12, 0o444)
    assert not (caps / "nvidia-cap12").is_symlink()
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o600 and elsewhere.read_text() == "host"


def test_a_linked_directory_is_refused_and_nothing_is_made_where_it_points(
    tmp_path: Path, may_mknod: None
) -> None:
    outside = tmp_path / "etc"
    outside.mkdir()
    (tmp_path / "root/dev").mkdir(parents=True)
    (tmp_path / "root/dev/nvidia-caps").symlink_to(outside)
    with pytest.raises(DeviceNodeError, match="nvidia-caps"):
        ensure_node(Roots(tmp_path / "root", tmp_path), "/dev/nvidia-caps/nvidia-cap12", 235,
                    12, 0o444)
    assert list(outside.iterdir()) == []
