"""CI's share of the fuzzing at volume (`python -m bench.fuzz`, docs/benchmarks.md): the same
generators and checks on a few thousand inputs, and proof that the check sees a crash."""

from __future__ import annotations

import pytest

from bench import fuzz

pytestmark = pytest.mark.reliability


def test_a_small_run_has_no_crash_and_no_state_change() -> None:
    tally, _ = fuzz.run(inputs=3000, network=100, seed=7)
    assert tally.crashes == [] and tally.state_changes == 0
    assert sum(tally.inputs.values()) >= 3000
    assert tally.refused > 0  # bad bodies did reach the endpoints, and were refused there
    assert {"bytes", "json", "mutated", "truncated", "tokens", "requests", "network"} \
        <= set(tally.inputs)


def test_a_decoder_raising_anything_but_a_schema_error_is_a_crash(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = fuzz.decode

    def fragile(data: bytes | str, kind: object) -> object:
        if len(data) % 7 == 3:
            raise KeyError("a decoder bug")
        return real(data, kind)

    monkeypatch.setattr(fuzz, "decode", fragile)
    tally = fuzz.Tally()
    fuzz.fuzz_decoders(fuzz.Gen(3), 500, tally)
    assert tally.crashes and "KeyError" in tally.crashes[0]
