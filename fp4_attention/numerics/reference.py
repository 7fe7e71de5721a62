"""The torch reference: tiled, FlashAttention-style attention for every recipe.

This module *defines* the numerics that every GPU backend is tested against. It runs on any device
(CPU included) in plain torch, one KV tile of ``block_n`` keys at a time with an online softmax, so
it never holds an Sq x Sk tensor; all queries are processed together. Products read exact
low-precision operands (``operands.py``) and accumulate in FP32, as the tensor-core MMAs do; a
kernel may differ from it only by FP32 accumulation order.

Conventions (contract §2, "facts from the paper's code release"):

* Scores in log2 units: ``z = s * log2(e)``. Causal masking is bottom-right aligned: query i sees
  key j iff ``j <= i + (Sk - Sq)``. A query with no visible key returns O = 0 and LSE = -inf.
* FP8 P (``fp8``, ``nvfp4qk_fp8pv``): ``P = exp2(z - m + 8)``, lifted by 2^8 into [0, 256] (up to
  2^(8 + threshold) with lazy rescaling), then rounded to E4M3 for the PV product. The denominator
  ``l`` sums the unrounded FP32 P (as FA3 does). ``O = acc / l * v_scale``.
* The LSE returned is the natural-log ``log sum_j exp(s_ij)``, FP32 ``[B, Hq, Sq]``. The statistic
  the backward uses is ``stat = 8 - LSE * log2(e)`` (lift minus LSE in log2 units), so that
  ``exp2(z + stat) = 256 * P`` lies in [0, 256].
* Backward (``bf16``, ``fp8``, ``nvfp4qk_fp8pv``) recomputes scores from the *saved quantized* Q/K
  (never re-quantizing), rebuilds the lifted P from the LSE, and:
    - dO goes to E5M2 with a per-(batch, head) FP32 scale, after folding V's per-channel scale
      into it (``dO~ = dO * v_scale``), so that both backward FP8 GEMMs keep their scales outside the
      contraction:  dP = (dO8 @ V8^T) * s_dO  and  dV = (P8^T @ dO8) * s_dO / 256 / v_scale.
      The 1/256 of dV is the epilogue factor, separate from the lift of P (contract §2).
    - D = rowsum(dO^ * O) in FP32 from the forward's output O and the *dequantized E5M2* dO^ that
      dP reads (``dO8 * s_dO / v_scale``): D must be consistent with dP, or dP - D, which cancels
      where one key takes most of the mass, is left with dO's rounding error (the attention-sink
      case of tools/fidelity.py: dQ cosine 0.75 with the BF16 dO, vs 0.99+ with this).
      The same holds for O: where key j holds the row's mass, O is v_op_j * v_scale rounded to
      BF16, and D equals dP_j only if that rounding loses nothing once divided by v_scale. V's
      per-channel scale is therefore a power of two (``quant.pow2_ceil``): ``O / v_scale`` is then
      exactly ``bf16(acc / l)``, which is ``v_op_j`` (E4M3 values are BF16 values). With an FP32
      scale a logit gap of 30 left dQ with norm ~2 where the exact one is ~1e-8 and the ``bf16``
      recipe's error ~1e-4 (tests/numerics/test_dominant_key.py sweeps gaps 5 to 40). What is left
      is what the ``bf16`` recipe has too: O's BF16 rounding where the other keys hold between
      about 2^-9 and 2^-20 of the mass (a relative error near 1 of a gradient that is itself tiny).
    - dS = P * (dP - D) with P = exp2(z + stat) / 256 in FP32 (unrounded), kept in BF16
      (contract: dS is the most error-sensitive tensor). ``fp8`` (per-token scales) rounds one
      BF16 dS for both products and puts the token scales in the operands: dQ = (bf16(dS) @
      bf16(k_op * col)) * scale, dK = (bf16(dS)^T @ bf16(q_op * row)) * scale; per-head scales
      (``nvfp4qk_fp8pv``, ``bf16``) stay on dS: dQ = (bf16(dS * col) @ k_op) * scale and
      dK = (bf16(dS * row)^T @ q_op) * scale (``reference_backward``'s ``token_scales``).
    - With a Q/K rotation (``recipe.qk_rotation``, ``rotation.py``) the saved Q/K are those of
      ``Q H``, ``K H``; dQ and dK above are then gradients in the rotated basis, and are returned
      as ``unrotate(dQ) = dQ H^T`` (same for dK), in FP32 before the final BF16 rounding.
  For ``bf16`` the same loop runs with lift 0, P and dS rounded to BF16 and dO/V unscaled, which is
  FlashAttention-2's backward.
* Direct-P recipes: see ``direct_p.py``.
"""

from __future__ import annotations

import math

import torch

from .direct_p import E8M0_MIN_EXP, p_codes
from .formats import round_e4m3
from .operands import QKOperands, Saved, SavedState, VOperand, qk_operands, quantize_qk, quantize_v, v_operand
from .quant import MXFP4_BLOCK, ieee_div, quantize_fp8
from .recipes import Recipe, check_saturation_invariant

__all__ = ["DEFAULT_BLOCK_N", "reference_backward", "reference_forward"]

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
DEFAULT_BLOCK_N = 128


def _group(t: torch.Tensor, hkv: int) -> torch.Tensor:
    """[B, Hq or 1, ...] -> [B, Hkv or 1, G or 1, ...] so that Q-side tensors meet K/V by group."""
    if t.shape[1] == 1:
        return t.unsqueeze(2)
    return t.unflatten(1, (hkv, t.shape[1] // hkv))


def _visible(sq: int, sk: int, j0: int, j1: int, causal: bool, device) -> torch.Tensor | None:
    """Bool [Sq, j1 - j0]: key j visible to query i (bottom-right causal alignment)."""
    if not causal:
        return None
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(j0, j1, device=device).unsqueeze(0)
    return j <= i + (sk - sq)


def _scores_log2(
    ops: QKOperands, qg, row_g, j0: int, j1: int, causal: bool, sq: int, sk: int
) -> torch.Tensor:
    """FP32 scores of keys [j0, j1) in log2 units, ``[B, Hkv, G, Sq, j1 - j0]``; masked = -inf."""
    kt = ops.k_op[:, :, j0:j1].unsqueeze(2)
    col = ops.col_scale.unsqueeze(2)
    if col.shape[-1] != 1:
        col = col[..., j0:j1]
    s = torch.matmul(qg, kt.transpose(-1, -2)) * (row_g * (ops.softmax_scale * LOG2E)) * col
    vis = _visible(sq, sk, j0, j1, causal, s.device)
    if vis is not None:
        s = s.masked_fill(~vis, -torch.inf)
    return s


def _round_p(p: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    return p.bfloat16().float() if recipe.pv == "bf16" else round_e4m3(p)


def reference_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    recipe: Recipe,
    *,
    causal: bool,
    softmax_scale: float,
    block_n: int = DEFAULT_BLOCK_N,
    rescale_threshold: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, SavedState]:
    """Forward of ``recipe`` on BF16 ``q [B, Hq, Sq, D]``, ``k, v [B, Hkv, Sk, D]``.

    Args:
        recipe: a :class:`Recipe`.
        causal: bottom-right aligned causal mask.
        softmax_scale: multiplies the scores (usually ``D ** -0.5``).
        block_n: keys per tile (any positive size for FP8/BF16 recipes; a multiple of 32 for the
            Direct-P recipes, whose MXFP4 blocks must not straddle tiles).
        rescale_threshold: lazy-rescale threshold in log2 units (FA4-style: the running max is
            only raised when a tile's max exceeds it by more than this). 0 = always rescale.
    Returns:
        ``(out, lse, state)``: out BF16 ``[B, Hq, Sq, D]``, lse FP32 ``[B, Hq, Sq]`` (natural log),
        and the :class:`SavedState` for backward.
    Raises:
        ValueError: block size or threshold violating the contract.
    """
    q_s, k_s = quantize_qk(q, k, recipe)
    v_s = quantize_v(v, recipe)
    return reference_forward_quantized(
        q_s,
        k_s,
        v_s,
        recipe,
        causal=causal,
        softmax_scale=softmax_scale,
        block_n=block_n,
        rescale_threshold=rescale_threshold,
    )


def reference_forward_quantized(
    q_s: Saved,
    k_s: Saved,
    v_s: Saved,
    recipe: Recipe,
    *,
    causal: bool,
    softmax_scale: float,
    block_n: int = DEFAULT_BLOCK_N,
    rescale_threshold: float = 0.0,
    reverse_tiles: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, SavedState]:
    """:func:`reference_forward` on operands already quantized as ``operands.quantize_qk`` /
    ``quantize_v`` return them (V in ``[B, Hkv, Sk, D]`` layout): the way a GPU backend is
    compared with the reference on identical quantized inputs.

    ``reverse_tiles``: visit the KV tiles (the same tiles, starting at key 0) last to first, as
    FA3/FA4-style kernels do (the ``cute`` backend). The order decides the running max each FP8 P
    tile is rounded against, so a kernel is compared rounding-for-rounding only in its own order."""
    if reverse_tiles and recipe.direct_p is not None:
        raise ValueError("reverse_tiles: not for the Direct-P recipes (their MXFP4 P has no running max)")
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n <= 0:
        raise ValueError(f"block_n must be a positive int, got {block_n!r}")
    check_saturation_invariant(recipe.p_lift_log2, rescale_threshold)
    ops = qk_operands(q_s, k_s, recipe, softmax_scale)
    vo = v_operand(v_s, recipe)
    if recipe.direct_p is not None:
        if block_n % MXFP4_BLOCK:
            raise ValueError(
                f"recipe {recipe.name}: block_n must be a multiple of {MXFP4_BLOCK}, got {block_n}"
            )
        out, lse = _forward_direct_p(ops, vo, recipe, causal, block_n)
    else:
        out, lse = _forward_fp(ops, vo, recipe, causal, block_n, rescale_threshold, reverse_tiles)
    return out, lse, SavedState(q=q_s, k=k_s, v=v_s, out=out, lse=lse)


def _forward_fp(
    ops: QKOperands,
    vo: VOperand,
    recipe: Recipe,
    causal: bool,
    block_n: int,
    threshold: float,
    reverse_tiles: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    sq = ops.q_op.shape[2]
    hkv, sk = ops.k_op.shape[1], ops.k_op.shape[2]
    qg, row_g = _group(ops.q_op, hkv), _group(ops.row_scale, hkv)
    lift = float(recipe.p_lift_log2)
    m = torch.full((*qg.shape[:-1], 1), -torch.inf, dtype=torch.float32, device=qg.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(qg.shape, dtype=torch.float32, device=qg.device)
    starts = range(0, sk, block_n)
    for j0 in reversed(starts) if reverse_tiles else starts:
        j1 = min(j0 + block_n, sk)
        z = _scores_log2(ops, qg, row_g, j0, j1, causal, sq, sk)
        m_tile = z.amax(-1, keepdim=True)
        m_new = torch.where(m_tile > m + threshold, m_tile, m)
        alpha = torch.where(m_new == m, torch.ones_like(m), torch.exp2(m - m_new))
        anchor = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp2(z - anchor + lift)
        l = l * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + torch.matmul(_round_p(p, recipe), vo.v_op[:, :, j0:j1].unsqueeze(2))
        m = m_new
    empty = l == 0
    out = torch.where(empty, torch.zeros_like(acc), acc / torch.where(empty, torch.ones_like(l), l))
    out = out * vo.v_scale.unsqueeze(2)
    lse = torch.where(empty, torch.full_like(m, -torch.inf), (m + torch.log2(l) - lift) * LN2)
    return out.flatten(1, 2).bfloat16(), lse.flatten(1, 2).squeeze(-1)


def _forward_direct_p(
    ops: QKOperands, vo: VOperand, recipe: Recipe, causal: bool, block_n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    sq = ops.q_op.shape[2]
    hkv, sk = ops.k_op.shape[1], ops.k_op.shape[2]
    qg, row_g = _group(ops.q_op, hkv), _group(ops.row_scale, hkv)
    m = torch.full((*qg.shape[:-1], 1), -torch.inf, dtype=torch.float32, device=qg.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(qg.shape, dtype=torch.float32, device=qg.device)
    for j0 in range(0, sk, block_n):
        j1 = min(j0 + block_n, sk)
        j1p = j0 + math.ceil((j1 - j0) / MXFP4_BLOCK) * MXFP4_BLOCK
        z = _scores_log2(ops, qg, row_g, j0, j1, causal, sq, sk)
        z = torch.nn.functional.pad(z, (0, j1p - j1), value=-torch.inf)
        nb = (j1p - j0) // MXFP4_BLOCK
        key_index = torch.arange(j0, j1p, device=z.device).view(nb, MXFP4_BLOCK)
        codes, e_b = p_codes(z.unflatten(-1, (nb, MXFP4_BLOCK)), recipe.direct_p, key_index)
        m_new = torch.maximum(m, e_b.amax(-1, keepdim=True))
        rescale = torch.where(m_new == m, torch.ones_like(m), torch.exp2(m - m_new))
        rel = e_b - torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        # E8M0 holds 2^-127 .. 2^0 relative to the anchor; blocks further below are flushed.
        alpha = torch.where(rel >= E8M0_MIN_EXP, torch.exp2(rel), torch.zeros_like(rel))
        l = l * rescale + (alpha * ieee_div(codes.sum(-1), 6.0)).sum(-1, keepdim=True)
        p_rep = (alpha.unsqueeze(-1) * codes).flatten(-2)  # 2^rel * q: exact in FP32
        acc = acc * rescale + torch.matmul(p_rep, vo.v_op[:, :, j0:j1p].unsqueeze(2))
        m = m_new
    empty = l == 0
    out = torch.where(
        empty, torch.zeros_like(acc), ieee_div(acc, 36.0) / torch.where(empty, torch.ones_like(l), l)
    )
    lse = torch.where(empty, torch.full_like(m, -torch.inf), (m + torch.log2(l)) * LN2)
    return out.flatten(1, 2).bfloat16(), lse.flatten(1, 2).squeeze(-1)


def reference_backward(
    state: SavedState,
    dout: torch.Tensor,
    recipe: Recipe,
    *,
    causal: bool,
    softmax_scale: float,
    block_n: int = DEFAULT_BLOCK_N,
    ds_round=None,
    token_scales: str | None = None,
    dlse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of a training recipe from its saved state (see the module docstring).

    Args:
        state: from :func:`reference_forward` with the same recipe.
        dout: BF16 ``[B, Hq, Sq, D]``.
        dlse: the gradient of the natural-log LSE, FP32 ``[B, Hq, Sq]``, or None. Since
            d LSE_i / d x_ij = P_ij for the scaled scores x, it enters as ``D - dlse`` in
            ``dS = P * (dP - D)`` (exact, in FP32; the recipes' roundings are those of dP and dS).
        ds_round: how the dQ/dK products' dS operands are rounded: called as
            ``ds_round(t, "dq", j0)`` and ``ds_round(t, "dk", j0)`` with ``t`` FP32 ``[B, Hkv, G,
            Sq, keys of the tile]`` (its first key ``j0``): dS itself, or ``dS * col`` and
            ``dS * row`` with the ``"ds"`` placement of ``token_scales``;
            returns the rounded values in FP32, the same shape. None = BF16, the recipes'
            definition. Another rounding (FP8 with a per-tile scale, ``bench/ds_fp8_numerics.py``)
            measures a kernel option's numerics.
        token_scales: where the dQ/dK products apply the Q/K token scales. ``"ds"``: on dS (two
            BF16 dS per score, ``bf16(dS * col) @ k_op`` and ``bf16(dS * row)^T @ q_op``).
            ``"operands"``: in the BF16 operands, one BF16 dS for both products, as FA4's BF16
            kernel: ``ds_round(dS) @ bf16(k_op * col)`` and ``ds_round(dS)^T @ bf16(q_op * row)``,
            ``ds_round`` then called with ``t = dS``. None (the recipes' definition): ``"operands"``
            for per-token scales (``fp8``: E4M3 Q/K, whose BF16 images times an FP32 scale are
            rounded once), ``"ds"`` for per-head ones (``nvfp4qk_fp8pv``, whose exact BF16 decodes
            the S^T product reads, and ``bf16``). ``fp8`` took ``"operands"`` on the H200 measurement
            of ``results/cute_scaled_operands_h200/`` (2-3% faster CuTe backward, every fidelity
            family within 6e-5 cosine of ``"ds"``); the contract's rule, dS in BF16, holds both ways.
    Returns:
        ``(dq, dk, dv)`` in BF16, shaped like q, k, v (straight-through to the BF16 inputs).
    Raises:
        NotImplementedError: for a forward-only (Direct-P) recipe.
    """
    if token_scales is None:
        token_scales = "operands" if recipe.qk == "fp8" else "ds"
    if token_scales not in ("ds", "operands"):
        raise ValueError(f"reference_backward: token_scales must be 'ds' or 'operands', got {token_scales!r}")
    if not recipe.trainable:
        raise NotImplementedError(
            f"recipe {recipe.name} is forward-only (MXFP4 P/V diverged in every training run of the paper); "
            "train with bf16, fp8 or nvfp4qk_fp8pv"
        )
    ops = qk_operands(state.q, state.k, recipe, softmax_scale)
    vo = v_operand(state.v, recipe)
    sq = ops.q_op.shape[2]
    hkv, sk = ops.k_op.shape[1], ops.k_op.shape[2]
    lift = float(recipe.p_lift_log2)
    qg, row_g = _group(ops.q_op, hkv), _group(ops.row_scale, hkv)
    lse_g = _group(state.lse.unsqueeze(-1), hkv)
    stat = torch.where(torch.isinf(lse_g), torch.full_like(lse_g, -torch.inf), lift - lse_g * LOG2E)

    dout_g = _group(dout.float(), hkv)
    v_scale_g = vo.v_scale.unsqueeze(2)
    if recipe.pv == "fp8":
        do_q = quantize_fp8(dout_g * v_scale_g, "e5m2", dims=(-2, -1))
        do_op, s_do = do_q.data.float(), do_q.scale
    else:
        do_op, s_do = dout_g, torch.ones((1, 1, 1, 1, 1), device=dout.device)
    # D = rowsum(dO^ * O) with the same (dequantized) dO that dP reads, so dP - D cancels exactly
    # where P concentrates (an attention sink); the BF16 dO would leave its E5M2 rounding there.
    delta = ((do_op * s_do) * _group(state.out.float(), hkv) / v_scale_g).sum(-1, keepdim=True)
    if dlse is not None:
        delta = delta - _group(dlse.float().unsqueeze(-1), hkv)

    if ds_round is None:

        def ds_round(t, product, j0):
            return t.bfloat16().float()

    dq = torch.zeros(qg.shape, dtype=torch.float32, device=qg.device)
    dk = torch.zeros(ops.k_op.shape, dtype=torch.float32, device=qg.device)
    dv = torch.zeros(vo.v_op.shape, dtype=torch.float32, device=qg.device)
    for j0 in range(0, sk, block_n):
        j1 = min(j0 + block_n, sk)
        z = _scores_log2(ops, qg, row_g, j0, j1, causal, sq, sk)
        p_lift = torch.exp2(z + stat)
        p_op = _round_p(p_lift, recipe)
        v_t = vo.v_op[:, :, j0:j1].unsqueeze(2)
        dv[:, :, j0:j1] = (torch.matmul(p_op.transpose(-1, -2), do_op) * s_do).sum(2)
        dp = torch.matmul(do_op, v_t.transpose(-1, -2)) * s_do
        ds = (p_lift * 2.0**-lift) * (dp - delta)
        col = ops.col_scale.unsqueeze(2)
        col = col[..., j0:j1] if col.shape[-1] != 1 else col
        k_t = ops.k_op[:, :, j0:j1].unsqueeze(2)
        if token_scales == "operands":
            k_s = (k_t * col.transpose(-1, -2)).bfloat16().float()
            q_s = (qg * row_g).bfloat16().float()
            dq += torch.matmul(ds_round(ds, "dq", j0), k_s)
            dk[:, :, j0:j1] = torch.matmul(ds_round(ds, "dk", j0).transpose(-1, -2), q_s).sum(2)
        else:
            dq += torch.matmul(ds_round(ds * col, "dq", j0), k_t)
            dk[:, :, j0:j1] = torch.matmul(ds_round(ds * row_g, "dk", j0).transpose(-1, -2), qg).sum(2)
    dq = (dq * ops.softmax_scale).flatten(1, 2)
    dk = dk * ops.softmax_scale
    dv = dv * (2.0**-lift) / vo.v_scale
    if recipe.qk_rotation is not None:  # dQ/dK of the rotated Q H, K H -> of Q, K: g H^T, in FP32
        dq, dk = recipe.qk_rotation.unrotate(dq), recipe.qk_rotation.unrotate(dk)
    return dq.bfloat16(), dk.bfloat16(), dv.bfloat16()
