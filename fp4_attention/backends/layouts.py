"""Allocation in the caller's memory order (pure torch; no GPU needed).

The backends see ``[B, H, S, D]`` views of the caller's tensors (``interface.LAYOUTS``: bshd, sbhd
or bhsd memory). An output or a gradient allocated contiguous ``[B, H, S, D]`` must be copied on the
way back into a ``bshd`` or ``sbhd`` caller (autograd's gradient layout, megatron-core's
``reshape(sq, b, -1)``); one allocated in the caller's order needs none.
"""

from __future__ import annotations

import torch

__all__ = ["empty_in_layout_of"]


_INVERSE: dict[tuple[int, ...], tuple[int, ...] | None] = {}  # dims' memory order -> inverse (None: identity)


def empty_in_layout_of(like: torch.Tensor, shape, dtype=torch.bfloat16) -> torch.Tensor:
    """An uninitialized dense ``shape`` tensor whose dims lie in memory in the order of ``like``'s
    strides (outermost first; equal strides keep their dims' order): for ``like`` a ``[B, H, S, D]``
    view of ``[B, S, H, D]`` or ``[S, B, H, D]`` memory, the result is such a view too (``shape`` may
    differ from ``like``'s: K/V with fewer heads); for a contiguous ``like``, a contiguous tensor. The
    last dim is innermost whatever ``like``'s strides (a stride-0 dim of an expanded ``like`` would
    otherwise sort inside it): the kernels take it as the unit-stride one. On every step's path (the
    output and the gradients): the permutation is looked up, not recomputed."""
    strides = like.stride()
    last = len(strides) - 1
    order = (*sorted(range(last), key=strides.__getitem__, reverse=True), last)  # stable: ties in order
    if order not in _INVERSE:
        inverse = tuple(order.index(i) for i in range(last + 1))
        _INVERSE[order] = None if inverse == tuple(range(last + 1)) else inverse
    phys = torch.empty([shape[i] for i in order], dtype=dtype, device=like.device)
    inverse = _INVERSE[order]
    return phys if inverse is None else phys.permute(inverse)
