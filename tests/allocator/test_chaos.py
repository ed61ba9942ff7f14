"""The seeded model-based chaos run (bench/chaos.py) over the real watcher, allocator and
reclaimer, the simulated kubelet and API server: a short, fixed-seed budget in CI. Longer runs:
`python -m bench.chaos --steps N --seed S` (figures in docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from bench.chaos import run_chaos

SEEDS = (4, 8)  # each caught a partition handed to the wrong Pod before this was fixed
STEPS = 45


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", SEEDS)
async def test_no_invariant_breaks_under_a_seeded_interleaving(nc, js, seed: int) -> None:
    run = await run_chaos(nc, steps=STEPS, seed=seed, settle_every=15)
    assert run.violations == [], "\n".join(run.violations)
    assert run.steps == STEPS
