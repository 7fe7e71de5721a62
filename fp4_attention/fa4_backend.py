"""The ``fa4`` backend: flash-attn-4's CuTe DSL BF16 kernels (Hopper and Blackwell) for recipe ``bf16``.

The strongest BF16 control on Hopper (issue 11): the same interface and BF16 numerics as
``recipe='bf16'`` on the other backends, computed by FA4's own forward and backward
(``flash_attn.cute.interface._flash_attn_fwd`` / ``_flash_attn_bwd``, the calls its autograd
function makes). Needs ``flash-attn-4`` (``pip install 'fp4-attention-pretrain[cute]'``).
Tensors here are ``[B, H, S, D]``; FA4 takes ``[B, S, H, D]`` views (no copy).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .backends import UnsupportedError, register_backend
from .recipes import Recipe

try:
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd
except ImportError as err:  # re-raised by backends.get_backend with the alternative named
    raise ImportError(f"the fa4 backend needs flash-attn-4 ({err}); pip install 'fp4-attention-pretrain[cute]', "
                      "or use backend='triton'") from err

__all__ = ["FA4Backend", "FA4State"]


@dataclass
class FA4State:
    """Saved for backward: BF16 Q/K/V ``[B, H, S, D]``, the BF16 output and FA4's FP32 LSE ``[B, Hq, Sq]``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor


def _bshd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)


class FA4Backend:
    """flash-attn-4 BF16 forward and backward (recipe ``bf16`` only)."""

    name = "fa4"

    def check(self, recipe: Recipe, q, k, v) -> None:
        if recipe.name != "bf16":
            other = "backend='cute' (sm_90) or 'triton'" if recipe.name == "fp8" else "backend='triton'"
            raise UnsupportedError(f"fa4 backend: only recipe 'bf16' (FA4's Hopper kernels are BF16); "
                                   f"use {other} for {recipe.name!r}")
        if not q.is_cuda:
            raise UnsupportedError("fa4 backend needs CUDA tensors; use backend='reference' on CPU")
        if q.dtype != torch.bfloat16:
            raise UnsupportedError(f"fa4 backend: inputs must be BF16, got {q.dtype}; cast them or use "
                                   "backend='triton'")

    def forward(self, q, k, v, recipe: Recipe, *, causal: bool, softmax_scale: float):
        q, k, v = (t.contiguous() for t in (q, k, v))
        out, lse, *_ = _flash_attn_fwd(_bshd(q), _bshd(k), _bshd(v), softmax_scale=softmax_scale, causal=causal,
                                       return_lse=True)
        out = _bshd(out)
        return out, lse, FA4State(q=q, k=k, v=v, out=out, lse=lse)

    def backward(self, state: FA4State, dout, recipe: Recipe, *, causal: bool, softmax_scale: float):
        dq, dk, dv = _flash_attn_bwd(_bshd(state.q), _bshd(state.k), _bshd(state.v), _bshd(state.out),
                                     _bshd(dout.contiguous()), state.lse, softmax_scale, causal)
        return _bshd(dq), _bshd(dk), _bshd(dv)


register_backend(FA4Backend())
