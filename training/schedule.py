"""The learning-rate schedule, written once and used by both engines (CPU and megatron-core).

For the optimizer step ``step`` (1-based: the step about to be applied), with ``W`` warmup steps
and ``T`` steps in total::

    lr(step) = max_lr * step / W                                     step <= W
    lr(step) = min_lr + (max_lr - min_lr) * 0.5 * (1 + cos(pi * r))   W < step <= T
    lr(step) = min_lr                                                step > T
    with r = (step - W) / (T - W)

This is megatron-core's ``OptimizerParamScheduler`` cosine with ``init_lr = 0`` evaluated at the
step being taken (megatron evaluates it at the number of steps already taken, so its first update
uses lr 0); the floor is ``min_lr``. The engines write ``lr`` into every optimizer param group
(megatron's groups carry no per-group LR multiplier unless configured, which we do not do) and
``weight_decay * wd_mult`` (0 for biases and 1-D parameters, megatron's convention).
"""

from __future__ import annotations

import math

__all__ = ["lr_at"]


def lr_at(step: int, *, max_lr: float, min_lr: float, warmup_iters: int, total_iters: int) -> float:
    """Learning rate of optimizer step ``step`` (1-based); see the module docstring.

    Raises:
        ValueError: ``step < 1`` or ``warmup_iters >= total_iters``.
    """
    if step < 1:
        raise ValueError(f"step is 1-based, got {step}")
    if not 0 <= warmup_iters < total_iters:
        raise ValueError(f"need 0 <= warmup_iters < total_iters, got {warmup_iters}, {total_iters}")
    if step <= warmup_iters:
        return max_lr * step / warmup_iters
    if step > total_iters:
        return min_lr
    ratio = (step - warmup_iters) / (total_iters - warmup_iters)
    return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * ratio))
