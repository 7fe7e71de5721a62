"""The ``fa4`` backend: flash-attn-4's CuTe DSL BF16 kernels (Hopper and Blackwell) for recipe ``bf16``.

The strongest BF16 control on Hopper: the same interface and BF16 numerics as
``recipe='bf16'`` on the other backends, computed by FA4's own forward and backward
(``flash_attn.cute.interface._flash_attn_fwd`` / ``_flash_attn_bwd``, the calls its autograd
function makes). Needs ``flash-attn-4`` (``pip install 'fp4-attention-pretrain[cute]'``).
Tensors here are ``[B, H, S, D]``; FA4 takes ``[B, S, H, D]`` views (no copy).
"""

from __future__ import annotations

import torch

from ...numerics.operands import SavedState
from ...numerics.recipes import Recipe
from .. import deterministic_mode
from . import SPEC

try:
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd
except ImportError as err:  # re-raised by backends.get_backend with the alternative named
    raise ImportError(
        f"the fa4 backend needs flash-attn-4 ({err}); pip install 'fp4-attention-pretrain[cute]', "
        "or use backend='triton'"
    ) from err

__all__ = ["FA4Backend"]


def _bshd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)


def _own(t: torch.Tensor) -> torch.Tensor:
    """``t`` to save for the backward: itself when its storage holds nothing else, else a copy. A view
    into a larger buffer (megatron-core's K and V are slices of the fused QKV projection's output)
    would keep the whole buffer alive until the backward; its copy costs t's size once."""
    return t if t.untyped_storage().nbytes() == t.numel() * t.element_size() else t.contiguous()


class FA4Backend:
    """flash-attn-4 BF16 forward and backward (recipe ``bf16`` only)."""

    spec = SPEC

    def forward(self, q, k, v, recipe: Recipe, *, causal: bool, softmax_scale: float):
        # [B, S, H, D] views of the caller's tensors: FA4 reads them in place (its maybe_contiguous
        # copies only a tensor whose pointer or strides are not 16-byte aligned)
        out, lse, *_ = _flash_attn_fwd(
            _bshd(q), _bshd(k), _bshd(v), softmax_scale=softmax_scale, causal=causal, return_lse=True
        )
        out = _bshd(out)
        return out, lse, SavedState(q=_own(q), k=_own(k), v=_own(v), out=out, lse=lse)

    def backward(self, state: SavedState, dout, recipe: Recipe, *, causal: bool, softmax_scale: float):
        dq, dk, dv = _flash_attn_bwd(
            _bshd(state.q),
            _bshd(state.k),
            _bshd(state.v),
            _bshd(state.out),
            _bshd(dout),
            state.lse,
            softmax_scale,
            causal,
            # FA4's deterministic dQ accumulation in deterministic mode (runtime.deterministic), its
            # FP32 atomics otherwise
            deterministic=deterministic_mode(),
        )
        return _bshd(dq), _bshd(dk), _bshd(dv)
