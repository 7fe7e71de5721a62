"""RoPE on any device, for the interface (``numerics/rope.py`` defines it): the Triton kernel
(``triton/rope.py``) on CUDA tensors with a power-of-two head dim, the torch definition itself
elsewhere (a CPU, or a head dim such as 80 that the kernel's half-row loads do not take); both give
the same bits (``tests/backends/test_triton_rope*.py``).

Backends that declare ``fused_rope`` apply RoPE inside their Q/K quantizers and the interface
rotates their dQ/dK back (:func:`rope_pair_op` with ``grad=True``); for the others the interface
applies it first with :class:`RoPEFunction` (one more read and write of Q and K). Q and K (dQ and
dK) go through one Triton launch.
"""

from __future__ import annotations

import torch

from ..numerics.rope import RoPETables, apply_rope, rope_grad

__all__ = ["RoPEFunction", "rope_op", "rope_pair_op"]


def _triton_takes(x: torch.Tensor) -> bool:
    d = x.shape[-1]
    return x.is_cuda and d >= 2 and not d & (d - 1) and d <= 256


def rope_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, grad: bool = False) -> torch.Tensor:
    """``apply_rope(x, cos, sin)`` (``grad=True``: ``rope_grad``) of ``x [B, H, S, D]``: BF16 ``[B, H, S, D]``
    (in ``x``'s memory order from the kernel, contiguous from torch; module docstring for which
    implementation runs)."""
    if _triton_takes(x):
        from .triton.rope import rope_rows

        return rope_rows(x, cos, sin, grad=grad)
    return (rope_grad if grad else apply_rope)(x, cos, sin)


def rope_pair_op(
    q: torch.Tensor | None, k: torch.Tensor | None, rope: RoPETables, *, grad: bool = False
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(rope_op(q, cos_q, sin_q), rope_op(k, cos_k, sin_k))`` with ``rope``'s tables (``grad``: the
    transposed rotation of each), in one Triton launch when both are there and the kernel takes them
    (one head dim, CUDA, a power of two <= 256); a ``None`` stays ``None``."""
    one_launch = q is not None and k is not None and q.shape[-1] == k.shape[-1] and q.device == k.device
    if one_launch and _triton_takes(q):
        from .triton.rope import rope_rows_pair

        return rope_rows_pair(q, k, (rope.cos_q, rope.sin_q), (rope.cos_k, rope.sin_k), grad=grad)
    return (
        None if q is None else rope_op(q, rope.cos_q, rope.sin_q, grad=grad),
        None if k is None else rope_op(k, rope.cos_k, rope.sin_k, grad=grad),
    )


class RoPEFunction(torch.autograd.Function):
    """``(q, k) -> (rope(q), rope(k))`` with ``rope``'s tables (a :class:`RoPETables`), the transposed
    rotation as its backward (``numerics.rope``); each direction one launch for both (:func:`rope_pair_op`).
    The tables get no gradient."""

    @staticmethod
    def forward(ctx, q, k, rope: RoPETables):
        ctx.save_for_backward(rope.cos_q, rope.sin_q, rope.cos_k, rope.sin_k)
        ctx.set_materialize_grads(False)
        qr, kr = rope_pair_op(q, k, rope)
        # an output whose input needs no gradient needs none either (autograd would otherwise ask
        # the attention's backward for it)
        ctx.mark_non_differentiable(*[y for y, x in ((qr, q), (kr, k)) if not x.requires_grad])
        return qr, kr

    @staticmethod
    def backward(ctx, dq, dk):
        rope = RoPETables(*ctx.saved_tensors)
        dq = dq if ctx.needs_input_grad[0] else None
        dk = dk if ctx.needs_input_grad[1] else None
        dq, dk = rope_pair_op(dq, dk, rope, grad=True)
        return dq, dk, None
