"""The backward's per-query operands of the FP8 P/V recipes, shared by the GPU backends (torch on
the device; ``numerics/reference.py`` defines them).

* dO in E5M2 with V's per-channel scale folded in and one FP32 scale per (batch, query head);
* D = rowsum(dO^ * O / v_scale) of the same dequantized dO that dP reads, so that dP - D cancels
  where P concentrates (an attention sink; the reference's rule);
* the LSE statistic ``stat = LIFT - LSE log2 e`` from which the lifted P is rebuilt, -inf for rows
  without keys.
"""

from __future__ import annotations

import torch

from ..numerics.quant import FP8Tensor, quantize_fp8

__all__ = ["LOG2E", "lse_stat", "quantize_dout"]

LOG2E = 1.4426950408889634


def quantize_dout(
    dout: torch.Tensor, out: torch.Tensor, v_scale: torch.Tensor
) -> tuple[FP8Tensor, torch.Tensor, torch.Tensor]:
    """dO's E5M2 operand, its per-head scale and D.

    Args:
        dout, out: BF16 ``[B, Hq, Sq, D]``.
        v_scale: FP32 ``[B, Hkv, D]``, V's per-channel scale (a power of two).
    Returns:
        ``(do_q, s_do, delta)``: :class:`FP8Tensor` E5M2 ``[B, Hq, Sq, D]`` with scale ``[B, Hq, 1, 1]``,
        ``s_do`` FP32 ``[B, Hq]`` (a view of that scale) and ``delta`` FP32 ``[B, Hq, Sq]``.
    """
    b, hq = dout.shape[:2]
    v_scale_q = v_scale.repeat_interleave(hq // v_scale.shape[1], dim=1).unsqueeze(2)  # [B, Hq, 1, D]
    do_q = quantize_fp8(dout.float() * v_scale_q, "e5m2", dims=(-2, -1))
    delta = ((do_q.data.float() * do_q.scale) * out.float() / v_scale_q).sum(-1)
    return do_q, do_q.scale.reshape(b, hq), delta


def lse_stat(lse: torch.Tensor, lift: int) -> torch.Tensor:
    """``LIFT - LSE log2 e`` (FP32, contiguous, the shape of ``lse``); -inf where the LSE is -inf."""
    return torch.where(torch.isinf(lse), torch.full_like(lse, -torch.inf), lift - lse * LOG2E).contiguous()
