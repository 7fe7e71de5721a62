"""Quantized attention operands of each recipe: what forward saves, and what the products read.

All tensors are in ``[B, H, S, D]`` layout. The score of query i and key j is written, for every
recipe, as

    s_ij = (q_op_i . k_op_j) * row_scale_i * col_scale_j * softmax_scale     (FP32)

where ``q_op``/``k_op`` hold *exact* low-precision values (BF16-representable) and the scales are
FP32. This is the contract's §2 product, recipe by recipe:

| qk     | q_op, k_op                         | row_scale            | col_scale       |
|--------|------------------------------------|----------------------|-----------------|
| bf16   | BF16 values                        | 1                    | 1               |
| fp8    | E4M3 values                        | s_q(token)           | s_k(token) [1]  |
| nvfp4  | s_b * q (exact in BF16, <=6 bits)  | g_q(head)            | g_k(head)       |

([1] with ``Recipe.k_scale_keys`` = 64, s_k is one scale per 64 keys, held repeated per key)
so that the dequantized operands are ``q^ = q_op * row_scale`` and ``k^ = k_op * col_scale``.

The value operand is ``v_op * v_scale`` with ``v_scale`` per (batch, kv-head, channel), applied after
the PV product: BF16 values and scale 1 for ``bf16``; E4M3 values and the FP32 per-channel scale, a
power of two, for ``fp8``; for ``mxfp4`` (Direct-P recipes), ``v_op = alpha_V * q_V`` per 32 tokens
(exact in FP32; the paper's 1/6 of V is applied later, together with P's, as 1/36).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .quant import (
    MXFP4_BLOCK,
    FP8Tensor,
    MXFP4Tensor,
    NVFP4Tensor,
    nvfp4_global_scale,
    quantize_fp8,
    quantize_fp8_key_groups,
    quantize_mxfp4_paper,
    quantize_nvfp4,
)
from .recipes import Recipe

__all__ = [
    "QKOperands",
    "SavedState",
    "VOperand",
    "qk_operands",
    "quantize_qk",
    "quantize_v",
    "saved_bytes",
    "v_operand",
]

Saved = torch.Tensor | FP8Tensor | NVFP4Tensor | MXFP4Tensor


@dataclass
class SavedState:
    """What a forward keeps for its backward, ``[B, H, S, D]`` order throughout; the one state type
    of the reference and of every backend.

    Attributes:
        q, k: the quantized Q/K as :func:`quantize_qk` returns them (BF16 tensors, FP8Tensor or
            NVFP4Tensor).
        v: the quantized V in the layout of the forward that wrote it (the reference's is
            :func:`quantize_v`'s; a backend's docstring names its own, and only that backend's
            backward reads it).
        out: the BF16 output ``[B, Hq, Sq, D]``.
        lse: the FP32 natural-log LSE ``[B, Hq, Sq]``.
    """

    q: Saved
    k: Saved
    v: Saved
    out: torch.Tensor
    lse: torch.Tensor


@dataclass(frozen=True)
class QKOperands:
    """FP32 operands of the QK product; see the module docstring for the formula."""

    q_op: torch.Tensor  # [B, Hq, Sq, D]
    k_op: torch.Tensor  # [B, Hkv, Sk, D]
    row_scale: torch.Tensor  # broadcastable to [B, Hq, Sq, 1]
    col_scale: torch.Tensor  # broadcastable to [B, Hkv, 1, Sk]
    softmax_scale: float


@dataclass(frozen=True)
class VOperand:
    v_op: torch.Tensor  # [B, Hkv, Sk(padded to 32 for mxfp4), D] exact values
    v_scale: torch.Tensor  # broadcastable to [B, Hkv, 1, D]


def quantize_qk(q: torch.Tensor, k: torch.Tensor, recipe: Recipe) -> tuple[Saved, Saved]:
    """Quantize BF16 Q ``[B, Hq, Sq, D]`` and K ``[B, Hkv, Sk, D]`` as the recipe prescribes.

    Returns what forward saves for backward: the BF16 tensors (``bf16``), :class:`FP8Tensor` with a
    per-token FP32 scale (``fp8``; K's with ``recipe.k_scale_keys`` = 64 is one scale per 64 keys,
    repeated per key: ``quant.quantize_fp8_key_groups``), or :class:`NVFP4Tensor` with a
    per-(batch, head) global scale (``nvfp4``). With ``recipe.qk_rotation`` the quantizers see the
    FP32 rotated ``Q H`` and ``K H`` (``rotation.py``; no BF16 rounding in between), and the saved
    Q/K are those of the rotated basis.
    """
    if recipe.qk == "bf16":
        return q, k
    if recipe.qk_rotation is not None:
        q, k = recipe.qk_rotation.rotate(q), recipe.qk_rotation.rotate(k)
    if recipe.qk == "fp8" and recipe.k_scale_keys > 1:  # K per group of keys, scale repeated per key
        return quantize_fp8(q, "e4m3", dims=(-1,)), quantize_fp8_key_groups(k, recipe.k_scale_keys)
    if recipe.qk == "fp8":
        return quantize_fp8(q, "e4m3", dims=(-1,)), quantize_fp8(k, "e4m3", dims=(-1,))
    if recipe.qk == "nvfp4":
        return (
            quantize_nvfp4(q, nvfp4_global_scale(q, dims=(2, 3))),
            quantize_nvfp4(k, nvfp4_global_scale(k, dims=(2, 3))),
        )
    raise ValueError(f"recipe {recipe.name}: unknown Q/K format {recipe.qk!r}")


def qk_operands(q_saved: Saved, k_saved: Saved, recipe: Recipe, softmax_scale: float) -> QKOperands:
    """Decode saved Q/K into the FP32 operands and scales of the QK product."""
    if recipe.qk == "bf16":
        q_op, k_op = q_saved.float(), k_saved.float()
        row = torch.ones((1, 1, 1, 1), dtype=torch.float32, device=q_op.device)
        col = torch.ones((1, 1, 1, 1), dtype=torch.float32, device=q_op.device)
    elif recipe.qk == "fp8":
        q_op, k_op = q_saved.data.float(), k_saved.data.float()
        row = q_saved.scale
        col = k_saved.scale.transpose(-1, -2)
    elif recipe.qk == "nvfp4":
        q_op, k_op = q_saved.scaled_payload(), k_saved.scaled_payload()
        row = q_saved.global_scale
        col = k_saved.global_scale
    else:
        raise ValueError(f"recipe {recipe.name}: unknown Q/K format {recipe.qk!r}")
    return QKOperands(q_op=q_op, k_op=k_op, row_scale=row, col_scale=col, softmax_scale=float(softmax_scale))


def quantize_v(v: torch.Tensor, recipe: Recipe) -> Saved:
    """Quantize BF16 V ``[B, Hkv, Sk, D]``.

    ``fp8``: E4M3 with a power-of-two FP32 scale per (batch, kv-head, channel) (``quant.pow2_ceil``:
    the BF16 output divided by it is exact, which keeps the backward's D consistent with dP;
    ``reference.py``). ``mxfp4``: the paper's
    convention in blocks of 32 *tokens* per channel (the PV contraction dim), stored transposed as
    ``[B, Hkv, D, ceil(Sk / 32) * 32]`` with zero padding.
    """
    if recipe.pv == "bf16":
        return v
    if recipe.pv == "fp8":
        return quantize_fp8(v, "e4m3", dims=(-2,), pow2=True)
    if recipe.pv == "mxfp4":
        sk = v.shape[-2]
        pad = (-sk) % MXFP4_BLOCK
        vt = torch.nn.functional.pad(v.float(), (0, 0, 0, pad)).transpose(-1, -2)
        return quantize_mxfp4_paper(vt.contiguous())
    raise ValueError(f"recipe {recipe.name}: unknown P/V format {recipe.pv!r}")


def v_operand(v_saved: Saved, recipe: Recipe) -> VOperand:
    """Decode saved V into the exact FP32 operand of the PV product and its per-channel scale."""
    if recipe.pv == "bf16":
        v = v_saved.float()
        return VOperand(v, torch.ones((1, 1, 1, 1), dtype=torch.float32, device=v.device))
    if recipe.pv == "fp8":
        return VOperand(v_saved.data.float(), v_saved.scale)
    if recipe.pv == "mxfp4":
        alpha = v_saved.scales().repeat_interleave(MXFP4_BLOCK, dim=-1)
        v_op = (alpha * v_saved.codes()).transpose(-1, -2)  # alpha * q, exact in FP32
        return VOperand(v_op, torch.ones((1, 1, 1, 1), dtype=torch.float32, device=v_op.device))
    raise ValueError(f"recipe {recipe.name}: unknown P/V format {recipe.pv!r}")


def saved_bytes(*saved: Saved) -> int:
    """Bytes held by saved operands (payloads + scales)."""
    total = 0
    for s in saved:
        if isinstance(s, torch.Tensor):
            total += s.numel() * s.element_size()
        else:
            total += s.nbytes()
    return total
