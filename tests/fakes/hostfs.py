"""Host files the vendors' drivers keep beside their libraries, made under a test's root."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def char_device(path: Path, major: int, minor: int) -> bool:
    """Make a character device node; False where the process may not (no CAP_MKNOD)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    except PermissionError:
        return False
    return True
