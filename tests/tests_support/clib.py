"""Build the fake vendor C libraries the driver tests load through the real bindings.

Every fake (NVIDIA NVML, T-Head HGML, Hygon DMI) is one C source compiled at test time with the
system C compiler, against the vendor's own header where one is installable, into a directory of
its own, so that the binding finds it through its normal library lookup (`LD_LIBRARY_PATH`, an
SDK root variable, or the path it dlopens). Builds are cached by the hash of their inputs.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path


class CompilerMissing(RuntimeError):
    """No C compiler on PATH: the fake libraries cannot be built."""


def compiler() -> str:
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    raise CompilerMissing("no C compiler (cc, gcc or clang) on PATH")


def build_shared_library(
    soname: str,
    sources: Sequence[Path],
    out_dir: Path,
    *,
    include_dirs: Sequence[Path] = (),
    defines: Sequence[str] = (),
) -> Path:
    """Compile `sources` into `out_dir/<soname>` (e.g. `libnvidia-ml.so.1`) and return its path.

    Warnings are errors: a prototype that disagrees with the vendor header must fail the build,
    exactly as it would fail to link against the real library."""
    digest = hashlib.sha256()
    for path in [*sources, *sorted(p for d in include_dirs for p in Path(d).glob("*.h"))]:
        digest.update(path.read_bytes())
    digest.update(repr((soname, list(defines))).encode())
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / soname
    stamp = out_dir / f".{soname}.sha256"
    if target.exists() and stamp.exists() and stamp.read_text() == digest.hexdigest():
        return target
    command = [
        compiler(), "-shared", "-fPIC", "-O1", "-std=c11", "-Wall", "-Wextra", "-Werror",
        "-Wno-unused-parameter", f"-Wl,-soname,{soname}", "-o", str(target),
        *(f"-I{d}" for d in include_dirs), *(f"-D{d}" for d in defines),
        *(str(s) for s in sources),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"building {soname} failed:\n{' '.join(command)}\n{result.stderr}")
    stamp.write_text(digest.hexdigest())
    return target
