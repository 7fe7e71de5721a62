"""RoPE on any device, for the interface (``numerics/rope.py`` defines it): the Triton kernel
(``triton/rope.py``) on CUDA tensors with a power-of-two head dim, the torch definition itself
elsewhere (a CPU, or a head dim such as 80 that the kernel's half-row loads do not take); both give
the same bits (``tests/backends/test_triton_rope*.py``).

Backends that declare ``fused_rope`` apply RoPE inside their Q/K quantizers; for the others the
interface applies it first with :class:`RoPEFunction` (one more read and write of Q and K).
"""

from __future__ import annotations

import torch

from ..numerics.rope import apply_rope, rope_grad

__all__ = ["RoPEFunction", "rope_op"]


def rope_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, grad: bool = False) -> torch.Tensor:
    """``apply_rope(x, cos, sin)`` (``grad=True``: ``rope_grad``) of ``x [B, H, S, D]``: BF16 ``[B, H, S, D]``
    (in ``x``'s memory order from the kernel, contiguous from torch; module docstring for which
    implementation runs)."""
    d = x.shape[-1]
    if x.is_cuda and d >= 2 and not d & (d - 1) and d <= 256:
        from .triton.rope import rope_rows

        return rope_rows(x, cos, sin, grad=grad)
    return (rope_grad if grad else apply_rope)(x, cos, sin)


class RoPEFunction(torch.autograd.Function):
    """``x -> rope(x, cos, sin)`` with the transposed rotation as its backward (``numerics.rope``);
    ``cos``/``sin`` get no gradient."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return rope_op(x, cos, sin)

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        return rope_op(g, cos, sin, grad=True), None, None
