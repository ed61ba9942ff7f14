"""Build the fake vendor C libraries the driver tests load through the real bindings.

Every fake (NVIDIA NVML, T-Head HGML, Hygon DMI) is C compiled at test time with the system C
compiler, against the vendor's own header where one is installable (`vendor_include_dir`), into a
directory of its own, so that the binding finds it through its normal library lookup
(`LD_LIBRARY_PATH`, an SDK root variable, or the path it dlopens). Builds are cached by the hash
of their inputs.

Conventions every fake follows (the C side is `tests/fakes/common/fakestate.{h,c}`, compiled into
each fake with `COMMON_SOURCES` and `COMMON_INCLUDE`):
- its state is one file, named by an environment variable of its own (`FAKE_NVML_STATE`, ...),
  read and written under an exclusive lock at every call, so that separate processes share one
  card; without the file the library answers as the vendor's does with no driver loaded;
- failures are injected through that file: `FakeLibrary.fail(fn, code, times, skip)` makes the
  exported function `fn` ("*" for all) answer `code` `times` times (-1: forever) after letting
  `skip` calls through; `calls(fn)` counts the calls made;
- an argument the real library would crash on or reject (a struct by value where a pointer is
  due, a versioned struct without its version) is refused with the vendor's invalid-argument code
  and recorded: `complaints()` returns how many and the last one, so a test can fail on it;
- each fake is built once per test session by one session fixture in tests/conftest.py (e.g.
  `nvml_library`): a process can load only one object per soname, and `FakeLibrary` refuses to
  run when another one (a real vendor library) already holds it.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

FAKES = Path(__file__).resolve().parents[1] / "fakes"
COMMON_INCLUDE = FAKES / "common"
COMMON_SOURCES = (COMMON_INCLUDE / "fakestate.c",)


class CompilerMissing(RuntimeError):
    """No C compiler on PATH: the fake libraries cannot be built."""


def compiler() -> str:
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    raise CompilerMissing("no C compiler (cc, gcc or clang) on PATH")


def vendor_include_dir(distribution: str, header: str) -> Path:
    """The directory holding `header` inside the installed Python `distribution` (e.g. nvml.h in
    nvidia-nvml-dev), so a fake compiles against the vendor's header rather than a copy."""
    files = metadata.distribution(distribution).files or []
    for file in files:
        if file.name == header:
            return Path(str(file.locate())).parent
    raise FileNotFoundError(f"{distribution} ships no {header}")


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
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"building {soname} failed:\n{' '.join(command)}\n{result.stderr}")
    stamp.write_text(digest.hexdigest())
    return target


class FakeLibrary:
    """A built fake and one state file: the controls every fake exports (see the module doc).

    Loading the library here by its full path also makes it the one a binding's later
    `dlopen("<soname>")` in this process finds (the loader matches the soname of a loaded object);
    child processes find it through `env()`'s `LD_LIBRARY_PATH` instead."""

    state_env = ""  # the fake's state variable, set by each subclass

    def __init__(self, library: Path, state: Path) -> None:
        self.library = library
        self.state = state
        self.lib = ctypes.CDLL(str(library))

    def ensure_resolves(self) -> None:
        """Fail unless a `dlopen("<soname>")` in this process now yields this fake: a real vendor
        library loaded earlier would otherwise be driven by the tests (real hardware)."""
        found = ctypes.CDLL(self.library.name)
        if found._handle != self.lib._handle:
            raise RuntimeError(f"another {self.library.name} is already loaded in this process; "
                               "refusing to run the fake's tests against it")

    def env(self) -> dict[str, str]:
        """What a child process needs to load this fake on this state."""
        return {self.state_env: str(self.state), "LD_LIBRARY_PATH": str(self.library.parent)}

    def check(self, rc: int, what: str) -> int:
        if rc < 0:
            raise RuntimeError(f"fake {self.library.name}: {what} failed on {self.state}")
        return rc

    def fail(self, fn: str, code: int, times: int = 1, skip: int = 0) -> None:
        rc = self.lib.fake_fail(bytes(self.state), fn.encode(), code, times, skip)
        self.check(rc, f"arming {fn}")

    def clear_failures(self) -> None:
        self.check(self.lib.fake_clear(bytes(self.state)), "disarming failures")

    def calls(self, fn: str) -> int:
        return self.check(self.lib.fake_calls(bytes(self.state), fn.encode()), "counting")

    def complaints(self) -> tuple[int, str]:
        buf = ctypes.create_string_buffer(512)
        count = self.lib.fake_complaints(bytes(self.state), buf, len(buf))
        return self.check(count, "reading complaints"), buf.value.decode()
