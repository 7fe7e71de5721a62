"""One E4M3 dS tile for the dQ and dK products of the ``fp8`` backward: the numerics of the CuTe
backward's ``ds_fp8`` measurement option (issue 18 item 2, ``results/cute_bwd_fp8ds_probe/``).

With E4M3 Q/K payloads ``q8``, ``k8`` and token scales ``row_i`` (Q), ``col_j`` (K), the true
``dQ_i = sum_j dS_ij col_j k8_j`` and ``dK_j = sum_i dS_ij row_i q8_i``: dQ sums over keys, dK over
queries, so one tile serves both products against the raw payloads only if it carries both token
scales, ``T_ij = E4M3(dS_ij row_i col_j / s)``; then ``dQ_i = (s / row_i) sum_j T_ij k8_j`` and
``dK_j = (s / col_j) sum_i T_ij q8_i``. The one free factor is ``s``, one power of two per query head
(dK accumulates inside the MMA over every query block, and dQ's partial sums of every key block
are added before their per-query unscale, so ``s`` cannot change within a head).

:func:`shared_tile_round` is that rounding as a ``ds_round`` of ``reference_backward`` (with
``token_scales="ds"``), the reference the kernel option is tested against, given ``s``.
:func:`bound_scale` is the stateless policy for ``s`` the kernel option uses: the power of two at
or above ``max_j col_j (A ||v8_j|| + B) / 448`` with ``A = max_i row_i ||dO'_i||`` and ``B = max_i
row_i |D_i|`` (``dO'`` the dequantized E5M2 dO with V's channel scale folded in, ``v8`` V's E4M3
codes: ``|dP_ij| <= ||dO'_i|| ||v8_j||`` by Cauchy-Schwarz, and ``P <= 1``), so no value of ``T``
saturates. The bound is loose (23-54x above the true amax on Gaussian inputs, far more on
outliers: ``results/ds_fp8_numerics_cpu.md``), which costs fidelity that a scale from the true
amax (delayed scaling) would not.
"""

from __future__ import annotations

import torch

from .quant import pow2_ceil

__all__ = ["E4M3_MAX", "bound_scale", "shared_tile_round"]

E4M3_MAX = 448.0


def bound_scale(
    row: torch.Tensor, do_norm: torch.Tensor, delta: torch.Tensor, v_norm: torch.Tensor, col: torch.Tensor
) -> torch.Tensor:
    """The per-head scale ``s`` of :func:`shared_tile_round` from the bound (module docstring).

    Args:
        row: FP32 ``[B, Hq, Sq]`` Q token scales (NaN rows are ignored: their gradients are NaN
            whatever ``s``).
        do_norm: FP32 ``[B, Hq, Sq]`` ``||dO'_i||``, the L2 norm of each query's dequantized E5M2 dO
            (V's channel scale folded in, times the head's dO scale).
        delta: FP32 ``[B, Hq, Sq]`` D.
        v_norm: FP32 ``[B, Hkv, Sk]`` ``||v8_j||``, the L2 norm of each key's E4M3 V codes.
        col: FP32 ``[B, Hkv, Sk]`` K token scales (NaN keys ignored).
    Returns:
        FP32 ``[B, Hq]``, powers of two, at least 2^-126 (so that the kernel's ``1 / s`` is finite;
        1 for a head whose bound is 0 or not finite).
    Raises:
        ValueError: shapes that do not match (Hq a multiple of Hkv).
    """
    b, hq, sq = row.shape
    hkv = col.shape[1]
    if do_norm.shape != row.shape or delta.shape != row.shape or v_norm.shape != col.shape or hq % hkv:
        raise ValueError(
            f"bound_scale: row/do_norm/delta must be [B, Hq, Sq] and v_norm/col [B, Hkv, Sk] with Hq a "
            f"multiple of Hkv; got {tuple(row.shape)}, {tuple(do_norm.shape)}, {tuple(delta.shape)}, "
            f"{tuple(v_norm.shape)}, {tuple(col.shape)}"
        )
    z = torch.zeros((), dtype=torch.float32, device=row.device)
    a = torch.nan_to_num(row * do_norm, nan=0.0, posinf=0.0).amax(-1)  # [B, Hq]
    bb = torch.nan_to_num(row * delta.abs(), nan=0.0, posinf=0.0).amax(-1)
    cv = torch.nan_to_num(col * v_norm, nan=0.0, posinf=0.0).amax(-1)  # [B, Hkv]
    cm = torch.nan_to_num(col, nan=0.0, posinf=0.0).amax(-1)
    g = hq // hkv
    bound = a * cv.repeat_interleave(g, dim=1) + bb * cm.repeat_interleave(g, dim=1)
    ok = torch.isfinite(bound) & (bound > z)
    s = pow2_ceil(torch.where(ok, bound / E4M3_MAX, torch.ones_like(bound))).clamp_min(2.0**-126)
    return torch.where(ok, s, 1.0)


def shared_tile_round(row: torch.Tensor, col: torch.Tensor, s: torch.Tensor):
    """The ``ds_round`` of ``reference_backward(..., token_scales="ds")`` that defines the
    ``ds_fp8`` option: both products read ``T = E4M3(dS row_i col_j / s)`` (round to nearest even,
    saturating at 448), unscaled per query for dQ and per key for dK (module docstring).

    Args:
        row: FP32 ``[B, Hq, Sq]`` Q token scales; col: FP32 ``[B, Hkv, Sk]`` K token scales.
        s: FP32 ``[B, Hq]`` powers of two (:func:`bound_scale`, or a scale from the true amax).
    Returns:
        ``rnd(t, product, j0)``: ``t`` FP32 ``[B, Hkv, G, Sq, keys]`` is ``dS * col`` for ``"dq"``
        and ``dS * row`` for ``"dk"`` (the ``"ds"`` placement), the keys starting at ``j0``; it
        returns the operand's value ``T s / row`` (dQ) or ``T s / col`` (dK).
    """
    hkv = col.shape[1]
    r = row.unflatten(1, (hkv, -1)).unsqueeze(-1)  # [B, Hkv, G, Sq, 1]
    sc = s.unflatten(1, (hkv, -1))[..., None, None]  # [B, Hkv, G, 1, 1]
    c_all = col.unsqueeze(2).unsqueeze(-2)  # [B, Hkv, 1, 1, Sk]

    def rnd(t: torch.Tensor, product: str, j0: int) -> torch.Tensor:
        c = c_all[..., j0 : j0 + t.shape[-1]]
        x = (t * r if product == "dq" else t * c) / sc  # dS row col / s
        y = x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * sc
        return y / r if product == "dq" else y / c

    return rnd
