"""The main job's first steps on a CPU against the committed golden losses (``golden.py``).

Tolerance: :data:`TOL` absolute on every step's training loss. The golden run is pinned to MKL's
reproducible code path and ATen's AVX2 kernels in a fresh process (``golden.PINNED_ENV``; why, with
the measurement: ``golden.py``): there one and two threads give the same losses bit for bit.
Changing the attention numerics moves them by much more than TOL (the committed ``bf16`` run
against the ``fp8`` one); ``test_tolerance_resolves_a_recipe_change`` keeps that margin (> 10 x
TOL) checked.
"""

from __future__ import annotations

import pytest

from .golden import read_golden, run_pinned_losses

TOL = 2e-4


def test_tolerance_resolves_a_recipe_change():
    golden = read_golden()
    gaps = [abs(golden["losses"][s] - golden["bf16_losses"][s]) for s in golden["losses"]]
    assert max(gaps) > 10 * TOL, gaps


@pytest.mark.slow
def test_default_job_matches_the_golden_losses():
    golden = read_golden()
    losses = run_pinned_losses()
    assert sorted(losses) == sorted(golden["losses"])
    diffs = {s: losses[s] - golden["losses"][s] for s in losses}
    assert all(abs(d) <= TOL for d in diffs.values()), (
        f"training losses moved beyond {TOL} from tests/assets/losses/default_cpu.json: {diffs}; if the "
        "change is intended, re-record with `python -m tests.training.golden --write` and say why"
    )
