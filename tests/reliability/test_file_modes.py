"""What the services leave on the node's filesystem is no more open than it must be.

Device-plugin sockets: kubelet (root) connects to them; nobody else needs to, and connecting to a
unix socket needs write permission on it, so owner read-write (0600) is the narrowest that works.
PK_PODS_DIR: the allocator writes, the reclaimer and the GC remove, all as the same user;
`partkeeper.workdir` promises directories 0750 and files 0640 whatever the umask, but for a slice's
cache dir (0777: the container's non-root processes create the limiter's shared cache file in it).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from partkeeper import workdir
from partkeeper.workdir.write import CACHE_MODE
from tests_support.reliability import Scene, scene

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]

SOCKET_OPEN_BITS = 0o077  # anything for group or others


def plugin_sockets(sc: Scene) -> dict[str, int]:
    found = {}
    for entry in sc.rig.layout.cluster.device_plugin_dir.iterdir():
        st = entry.lstat()
        if stat.S_ISSOCK(st.st_mode) and entry.name.startswith("partkeeper-"):
            found[entry.name] = stat.S_IMODE(st.st_mode)
    assert found, "the allocator serves no socket"
    return found


def tree_modes(root: Path) -> dict[str, int]:
    modes = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            modes[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return modes


async def test_pods_dir_entries_have_exact_modes() -> None:
    async with scene() as sc:
        await sc.admit("1g.10gb", "modes")
        await sc.admit(None, "modes")
        modes = tree_modes(sc.rig.layout.pods_dir)
        assert modes, "nothing was written under PK_PODS_DIR"
        for rel, mode in modes.items():
            path = sc.rig.layout.pods_dir / rel
            if path.is_dir() and path.parent.name == "sliced" and path.name == "cache":
                expected = CACHE_MODE  # the container's own processes write the limiter's cache
            else:
                expected = workdir.DIR_MODE if path.is_dir() else workdir.FILE_MODE
            assert mode == expected, (rel, oct(mode))
        await sc.work.delete_all()
        await sc.check_converged()


async def test_plugin_sockets_refuse_group_and_others() -> None:
    async with scene() as sc:
        opened = {n: oct(m) for n, m in plugin_sockets(sc).items() if m & 0o022}
        assert not opened, f"sockets connectable by group or others: {opened}"


async def test_plugin_sockets_are_owner_only_whatever_the_umask() -> None:
    async with scene() as sc:
        previous = os.umask(0)  # the restarted allocator inherits it
        try:
            await sc.rig.restart("allocator")
        finally:
            os.umask(previous)
        await sc.admit("1g.10gb", "umask")  # serving (and registered) under the new umask
        opened = {n: oct(m) for n, m in plugin_sockets(sc).items() if m & SOCKET_OPEN_BITS}
        assert not opened, f"sockets open to group or others: {opened}"
