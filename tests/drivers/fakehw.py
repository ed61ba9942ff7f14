"""The tests' hands on the fake vendor libraries' hardware (tests/fakes/common/fakehw.h).

`FakeHardware` writes and edits the state file the C fakes lock and read on every call: the cards,
their profiles as each vendor's library reports them (ids, probe indices, names, placements), the
instances that exist, busy flags, injected failures and lags. The profile data here are the
vendors' facts (docs/drivers.md), not partkeeper's tables, so the drivers are checked against them.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests_support.clib import build_shared_library

FAKES = Path(__file__).resolve().parents[1] / "fakes"


@dataclass
class Record:
    kind: str
    fields: list[str]

    def line(self) -> str:
        return " ".join([self.kind, *self.fields])


@dataclass
class FakeHardware:
    """One state file; every edit is one locked read-modify-write, as the C side does."""

    path: Path
    records: list[Record] = field(default_factory=list)

    def write(self, lines: list[str]) -> None:
        self.path.write_text("\n".join(lines) + "\n")

    @contextmanager
    def edit(self) -> Iterator[list[Record]]:
        with open(self.path, "r+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            records = [Record(*_split(line)) for line in handle.read().splitlines() if line]
            yield records
            handle.seek(0)
            handle.truncate()
            handle.write("\n".join(r.line() for r in records) + "\n")

    def read(self) -> list[Record]:
        with self.edit() as records:
            return list(records)

    def fail(self, function: str, code: int, times: int = 1) -> None:
        with self.edit() as records:
            records.append(Record("fail", [function, str(code), str(times)]))

    def lag(self, function: str, ms: int) -> None:
        with self.edit() as records:
            records.append(Record("lag", [function, str(ms)]))

    def quirk(self, name: str, value: int) -> None:
        with self.edit() as records:
            records.append(Record("quirk", [name, str(value)]))

    def set_busy(self, matches: Callable[[Record], bool], on: bool) -> None:
        with self.edit() as records:
            hit = [r for r in records if r.kind == "ci" and matches(r)]
            assert hit, "no compute instance matches"
            for r in hit:
                r.fields[4] = "1" if on else "0"

    def of(self, kind: str) -> list[list[str]]:
        return [r.fields for r in self.read() if r.kind == kind]


def _split(line: str) -> tuple[str, list[str]]:
    kind, _, rest = line.partition(" ")
    if kind in ("card", "profile"):
        head = 8 if kind == "card" else 8
        parts = rest.split(" ", head)
        return kind, parts
    return kind, rest.split()


def build(vendor: str, soname: str, out_dir: Path) -> Path:
    """Compile tests/fakes/<vendor>/fake_<vendor>.c with the shared hardware into `out_dir`."""
    return build_shared_library(
        soname,
        [FAKES / vendor / f"fake_{vendor}.c", FAKES / "common" / "fakehw.c"],
        out_dir,
        include_dirs=[FAKES / "common", FAKES / vendor],
    )
