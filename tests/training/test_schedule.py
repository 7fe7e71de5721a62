"""The LR schedule: warmup, cosine, floor; equal to megatron-core's OptimizerParamScheduler."""

from __future__ import annotations

import math

import pytest
import torch

from training.schedule import lr_at

KW = dict(max_lr=3e-4, min_lr=3e-5, warmup_iters=2000, total_iters=23842)


def test_values():
    assert lr_at(1, **KW) == pytest.approx(3e-4 / 2000)
    assert lr_at(1000, **KW) == pytest.approx(1.5e-4)
    assert lr_at(2000, **KW) == pytest.approx(3e-4)
    mid = 2000 + (23842 - 2000) // 2
    assert lr_at(mid, **KW) == pytest.approx(3e-5 + 0.5 * 2.7e-4 * (1 + math.cos(math.pi * 10921 / 21842)))
    assert lr_at(23842, **KW) == pytest.approx(3e-5)
    assert lr_at(30000, **KW) == 3e-5
    lrs = [lr_at(s, **KW) for s in range(2000, 23843, 97)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_errors():
    with pytest.raises(ValueError, match="1-based"):
        lr_at(0, **KW)
    with pytest.raises(ValueError, match="warmup_iters < total_iters"):
        lr_at(1, max_lr=1, min_lr=0, warmup_iters=5, total_iters=5)


def test_matches_megatron_scheduler():
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = OptimizerParamScheduler(
        opt,
        init_lr=0.0,
        max_lr=1e-3,
        min_lr=1e-4,
        lr_warmup_steps=10,
        lr_decay_steps=100,
        lr_decay_style="cosine",
        start_wd=0.1,
        end_wd=0.1,
        wd_incr_steps=100,
        wd_incr_style="constant",
    )
    for step in range(1, 120):
        sched.step(1)  # megatron's lr after `step` steps = ours for step `step`
        assert opt.param_groups[0]["lr"] == pytest.approx(
            lr_at(step, max_lr=1e-3, min_lr=1e-4, warmup_iters=10, total_iters=100), rel=1e-12
        )
