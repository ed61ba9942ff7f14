"""Reaching a vendor's C library through ctypes: finding it, declaring its functions, its codes,
and the NVML structs both vendors keep as they are.

Shared by the `hgml` (T-Head) and `dmi` (Hygon) drivers. Every function is resolved from the one
handle the library was opened as (`CDLL.__getattr__` is `dlsym(handle, ...)`), never from the
process's global scope, which is what keeps Hygon's NVML-named symbols apart from NVIDIA's.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from partkeeper.drivers.base import (
    DriverError,
    InUseError,
    LibraryMissing,
    PlacementError,
    ReadError,
    UnknownError,
)

# NVML's return codes, which both vendors keep (T-Head adds GPU_NOT_FOUND 28).
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_GPU_NOT_FOUND = 28
ERROR_UNKNOWN = 999

_NAMES = {
    0: "SUCCESS", 1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED",
    4: "NO_PERMISSION", 5: "ALREADY_INITIALIZED", 6: "NOT_FOUND", 7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER", 9: "DRIVER_NOT_LOADED", 10: "TIMEOUT", 12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND", 15: "GPU_IS_LOST", 16: "RESET_REQUIRED", 17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH", 19: "IN_USE", 20: "MEMORY", 21: "NO_DATA",
    23: "INSUFFICIENT_RESOURCES", 25: "ARGUMENT_VERSION_MISMATCH", 26: "DEPRECATED",
    27: "NOT_READY", 28: "GPU_NOT_FOUND", 999: "UNKNOWN",
}  # fmt: skip

# The codes a probe of an id or index space answers for "nothing here": skipped, not failed.
ABSENT = frozenset({ERROR_NOT_SUPPORTED, ERROR_NOT_FOUND, ERROR_INVALID_ARGUMENT})


class Memory(ctypes.Structure):
    """NVML's `nvmlMemory_t`, in bytes."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class Placement(ctypes.Structure):
    """NVML's `nvmlGpuInstancePlacement_t`: where a GPU instance starts and how many slices."""

    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


def code_name(code: int) -> str:
    return f"{_NAMES.get(code, 'code')} ({code})"


class CallFailed(Exception):
    """A library call returned something other than SUCCESS."""

    def __init__(self, function: str, code: int) -> None:
        self.function = function
        self.code = code
        super().__init__(f"{function} returned {code_name(code)}")


@dataclass(frozen=True, slots=True)
class Library:
    """An opened vendor library: its handle and where it came from."""

    handle: ctypes.CDLL
    path: str

    def has(self, name: str) -> bool:
        try:
            getattr(self.handle, name)
        except AttributeError:
            return False
        return True

    def function(self, name: str, *argtypes: Any) -> Any:
        """The C function `name` with its argument types; returns an int code."""
        fn = getattr(self.handle, name)  # dlsym on this handle only
        fn.argtypes = list(argtypes)
        fn.restype = ctypes.c_int
        return fn


@dataclass(frozen=True)
class Api:
    """A vendor library's declared functions, each resolved from its own handle."""

    lib: Library
    fn: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.fn[name]
        except KeyError:
            raise AttributeError(name) from None


def open_first(candidates: Sequence[str], *, local: bool = True) -> Library:
    """Open the first candidate that loads (`RTLD_LOCAL` unless told otherwise); LibraryMissing
    (a StartupError) lists what was tried."""
    mode = os.RTLD_LOCAL if local else os.RTLD_GLOBAL
    tried: list[str] = []
    for candidate in candidates:
        try:
            return Library(ctypes.CDLL(candidate, mode=mode), candidate)
        except OSError as exc:
            tried.append(f"{candidate} ({exc})")
    raise LibraryMissing("no library could be opened; tried " + "; ".join(tried))


def declare(
    lib: Library, signatures: Mapping[str, tuple[Any, ...]],
    versioned: Mapping[str, Sequence[str]] | None = None,
) -> Api:
    """Every function of `signatures` resolved from `lib`'s own handle. A key of `versioned` is an
    entry point with versioned names: the first one the library exports is used (LibraryMissing
    when it exports none); a plain symbol it lacks is an AttributeError."""
    names: dict[str, str] = {}
    for key, candidates in (versioned or {}).items():
        found = next((n for n in candidates if lib.has(n)), None)
        if found is None:
            raise LibraryMissing(f"{lib.path} exports none of {', '.join(candidates)}")
        names[key] = found
    return Api(lib, {key: lib.function(names.get(key, key), *argtypes)
                     for key, argtypes in signatures.items()})


def load(vendor: str, opener: Callable[[list[str] | None], Api], paths: list[str] | None) -> Api:
    """`opener(paths)`: the vendor's library opened and declared; when it cannot be, a
    LibraryMissing (a StartupError) naming `vendor` and what the operator installs."""
    try:
        return opener(paths)
    except (LibraryMissing, AttributeError) as exc:
        raise LibraryMissing(f"{vendor}: {exc}; install the vendor's driver and SDK on the node, "
                             "or set PK_DRIVER=sim") from exc


def call(fn: Any, *args: Any) -> None:
    """Call `fn`; raise CallFailed on anything but SUCCESS."""
    code = fn(*args)
    if code != SUCCESS:
        raise CallFailed(fn.__name__, int(code))


def text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def read_call(op: str, card: int | None, what: str, fn: Any, *args: Any) -> None:
    """A read through the library: any failure is a ReadError, never "absent"."""
    try:
        call(fn, *args)
    except CallFailed as exc:
        raise ReadError(op, card, None, f"{what}: {exc}") from exc


def found(
    op: str, card: int, what: str, fn: Any, *args: Any, name: str | None = None
) -> bool:
    """A lookup through the library: False when it answers NOT_FOUND (nothing there), a ReadError
    naming the card (and instance `name`) for any other failure."""
    try:
        call(fn, *args)
    except CallFailed as exc:
        if exc.code == ERROR_NOT_FOUND:
            return False
        raise ReadError(op, card, name, f"{what}: {exc}") from exc
    return True


def read_uint(op: str, card: int | None, what: str, fn: Any, *args: Any) -> int:
    """A read whose answer is one `unsigned int` out-parameter, passed last."""
    out = ctypes.c_uint(0)
    read_call(op, card, what, fn, *args, ctypes.byref(out))
    return out.value


MAX_INSTANCES = 32  # the buffer partkeeper passes for instance lists (count in/out)

S = TypeVar("S", bound=ctypes.Structure)


def read_struct(op: str, card: int | None, what: str, fn: Any, handle: Any, struct: type[S]) -> S:
    """A read whose answer is one struct out-parameter: `fn(handle, &out)`."""
    out = struct()
    read_call(op, card, what, fn, handle, ctypes.byref(out))
    return out


def read_handles(op: str, card: int, what: str, fn: Any, kind: Any, *args: Any) -> list[Any]:
    """A listing into a caller's array: `fn(*args, array, &count)`, count in and out."""
    array = (kind * MAX_INSTANCES)()
    count = ctypes.c_uint(MAX_INSTANCES)
    read_call(op, card, what, fn, *args, array, ctypes.byref(count))
    return list(array[: min(count.value, MAX_INSTANCES)])


def memory_mib(op: str, card: int, fn: Any, dev: Any) -> int:
    """The card's total memory in MiB, read into NVML's `{total, free, used}` struct."""
    return int(read_struct(op, card, "reading the memory", fn, dev, Memory).total // 2**20)


def create_step(card: int, fn: Any, *args: Any) -> None:
    """A step of a create after its GPU instance exists: any failure is the cause of its undo."""
    try:
        call(fn, *args)
    except CallFailed as exc:
        raise UnknownError("create", card, None, str(exc)) from exc


def change_call(
    op: str, card: int, name: str | None, what: str, fn: Any, *args: Any,
    placement_codes: frozenset[int] = frozenset(),
) -> None:
    """A change through the library: IN_USE is an InUseError, a code in `placement_codes` a
    PlacementError, anything else an UnknownError; each names the card and the instance."""
    try:
        call(fn, *args)
    except CallFailed as exc:
        kind: type[DriverError] = UnknownError
        if exc.code == ERROR_IN_USE:
            kind = InUseError
        elif exc.code in placement_codes:
            kind = PlacementError
        raise kind(op, card, name, f"{what}: {exc}") from exc
