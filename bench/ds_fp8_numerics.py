"""What FP8 dS would cost in gradient fidelity (the CuTe backward's "dS in FP8" option), on the CPU.

    python bench/ds_fp8_numerics.py --out results/ds_fp8_numerics_cpu     # writes .md and .json

The dQ and dK products read dS in BF16 (``reference_backward``; the FP8 variants below start from
its ``token_scales="ds"`` placement: ``bf16(dS * col) @ K`` and ``bf16(dS * row)^T @ Q``). In FP8
they would run at FP8 rate: all five backward products on the FP8 tensor cores. This script runs the
reference backward of the ``fp8`` recipe with those two operands rounded to FP8 instead (the
``ds_round`` hook). It reports the dQ/dK cosines against float64 on the input families of
``tools/fidelity.py``, beside the BF16 definition, in the same run.

Scale granularities a kernel can apply (kernel tile: 64 queries x 128 keys):
- ``tile``: one scale per tile, amax / FMAX, for both operands.
- ``outer``: one scale per row of each product's M dimension: per query for dQ (folded into the
  tile's dQ partial before it is accumulated) and per key for dK (needs dK's FP32 promotion per
  query block).
- ``bound`` (E4M3 only): dQ per tile as ``tile``; dK with one *static* scale per key and query head,
  known before the loop, so that dK can keep accumulating inside the MMA (no promotion, no extra
  registers): ``|dS_ij row_i| <= A ||v_j|| + B`` with ``A = max_i row_i s_dO ||dO8_i||`` and
  ``B = max_i row_i |D_i|`` (P <= 1, Cauchy-Schwarz on dP), the bound over 448.
- ``bounds`` (E4M3): dK as ``bound``, and dQ with a static scale per query as well (no amax
  reduction across the tile's two warpgroups): ``|dS_ij col_j| <= s_dO ||dO8_i|| max_j col_j ||v_j||
  + |D_i| max_j col_j``.
- ``dk-only`` (E4M3): dQ's operand stays BF16, dK's is E4M3 with :func:`dk_operand_scale` (the
  ``bound`` scale rounded up to a power of two). A CuTe backward option with these numerics lost at
  the training shape on the H200 (results/cute_prep_h200/) and was deleted.
- ``shared`` (E4M3): one tile ``T = E4M3(dS row_i col_j / s)`` for both products against the raw
  E4M3 Q/K payloads (the design whose speed ``results/cute_bwd_fp8ds_probe/`` prices): the token
  scales must ride on dS (dK sums over queries, dQ over keys), so the only free factor is one static
  power of two ``s`` per query head and block of keys (a CTA's), from ``bound``'s bound times
  ``col_j``; ``shared-amax`` is the same with the block's true amax (an oracle: no kernel knows it
  before its loop), which prices the bound's looseness (:func:`shared_round`).

- ``bf16/scales-in-operands``: dS stays BF16, but the Q/K token scales move from dS into the BF16
  operands (``reference_backward(token_scales="operands")``: one dS for both products, as FA4's
  BF16 kernel; 2 FMUL and half an F2FP fewer per score element in the CuTe kernel,
  results/cute_bwd_profile_h200/). The ``fp8`` recipe's definition since
  results/cute_scaled_operands_h200/; ``bf16/scales-on-ds`` (``token_scales="ds"``) is the
  placement it replaced, and ``nvfp4qk_fp8pv``'s definition.
- ``bf16/one-ds-col`` (nvfp4qk_fp8pv, whose token scales are per-head constants): one BF16
  ``dS * col`` for both products and dK rescaled by ``row / col`` after its product
  (:func:`ds_col_round`): the one-dS loop without scaled BF16 tiles, which that kernel's S^T reads.

E4M3 (more mantissa) and E5M2 (more range) are both measured. Rounding is to nearest even with
saturation (torch's conversion after a clamp, as the Triton quantizers do). The dV product and the
forward are unchanged.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from fidelity import _metrics, float64_case  # noqa: E402

import fp4_attention as fa  # noqa: E402
from fp4_attention.numerics.quant import pow2_ceil  # noqa: E402
from fp4_attention.numerics.reference import reference_backward, reference_forward  # noqa: E402

FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}
TILE_M = 64  # the CuTe backward's query rows per step (its keys per tile are the reference's block_n)
FAMILIES = ["normal", "outliers", "sink", "std=0.5", "std=2", "std=4"]
# the variants --recipe nvfp4qk_fp8pv runs
ANY_RECIPE = ("bf16 (definition)", "bf16/scales-in-operands", "bf16/scales-on-ds", "bf16/one-ds-col")


# One E4M3 tile T = E4M3(dS row_i col_j / s) for dQ and dK, s one power of two per query head: the
# numerics of the CuTe backward option ds_fp8, measured on the H200 and deleted (its code is at
# 2a7f38f; results/cute_bwd_fp8ds_probe/README.md). dQ_i = (s / row_i) sum_j T_ij k8_j and
# dK_j = (s / col_j) sum_i T_ij q8_i; bound_scale is the stateless s from |dP_ij| <= ||dO'_i|| ||v8_j||
# (Cauchy-Schwarz) and P <= 1, so that no value of T saturates.


def bound_scale(
    row: torch.Tensor, do_norm: torch.Tensor, delta: torch.Tensor, v_norm: torch.Tensor, col: torch.Tensor
) -> torch.Tensor:
    """The per-head scale ``s`` of :func:`shared_tile_round` from the bound (the comment above).

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
    s = pow2_ceil(torch.where(ok, bound / 448.0, torch.ones_like(bound))).clamp_min(2.0**-126)
    return torch.where(ok, s, 1.0)


def shared_tile_round(row: torch.Tensor, col: torch.Tensor, s: torch.Tensor):
    """The ``ds_round`` of ``reference_backward(..., token_scales="ds")`` that defined the
    ``ds_fp8`` option: both products read ``T = E4M3(dS row_i col_j / s)`` (round to nearest even,
    saturating at 448), unscaled per query for dQ and per key for dK (the comment above).

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
        y = x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * sc
        return y / r if product == "dq" else y / c

    return rnd


def fp8_round(fmt: str, granularity: str):
    """A ``ds_round`` for ``reference_backward``: FP8 ``fmt`` with per-``granularity`` scales."""
    dtype, fmax = FORMATS[fmt]

    def rnd(t: torch.Tensor, product: str, j0: int) -> torch.Tensor:
        sq, bn = t.shape[-2:]
        pad = (-sq) % TILE_M
        x = torch.nn.functional.pad(t, (0, 0, 0, pad)).unflatten(-2, (-1, TILE_M))  # [..., tiles, 64, bn]
        a = x.abs()
        if granularity == "tile":
            amax = a.amax(dim=(-2, -1), keepdim=True)
        elif product == "dq":  # per query (row of dS, the dQ product's M)
            amax = a.amax(dim=-1, keepdim=True)
        else:  # per key (row of dS^T, the dK product's M)
            amax = a.amax(dim=-2, keepdim=True)
        scale = amax / fmax
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # all zero, or amax / FMAX underflows
        q = (x / scale).clamp(-fmax, fmax).to(dtype).float() * scale
        return q.flatten(-3, -2)[..., :sq, :]

    return rnd


def bound_round(state, dout: torch.Tensor, recipe, softmax_scale: float, static_dq: bool = False):
    """The ``bound`` (``static_dq``: ``bounds``) variant's ``ds_round`` for this state and dO
    (module docstring)."""
    from fp4_attention.numerics.operands import qk_operands, v_operand
    from fp4_attention.numerics.quant import quantize_fp8

    ops = qk_operands(state.q, state.k, recipe, softmax_scale)
    vo = v_operand(state.v, recipe)
    hkv = ops.k_op.shape[1]
    group = lambda x: x.unflatten(1, (hkv, x.shape[1] // hkv))  # noqa: E731
    v_scale = vo.v_scale.unsqueeze(2)  # [B, Hkv, 1, 1, D]
    do_q = quantize_fp8(group(dout.float()) * v_scale, "e5m2", dims=(-2, -1))
    delta = ((do_q.data.float() * do_q.scale) * group(state.out.float()) / v_scale).sum(-1)  # [B, Hkv, G, Sq]
    row = group(ops.row_scale).squeeze(-1)
    a = (row * do_q.scale.squeeze(-1) * do_q.data.float().norm(dim=-1)).amax(-1, keepdim=True)
    b = (row * delta.abs()).amax(-1, keepdim=True)
    bound = a * vo.v_op.norm(dim=-1).unsqueeze(2) + b  # [B, Hkv, G, Sk]
    dk_scale = torch.where(bound > 0, bound / FORMATS["e4m3"][1], torch.ones_like(bound)).unsqueeze(-2)
    per_tile = fp8_round("e4m3", "tile")
    col = ops.col_scale.unsqueeze(2).squeeze(-2)  # [B, Hkv, 1, Sk] (1 for a scalar scale)
    cv = (col * vo.v_op.norm(dim=-1).unsqueeze(2)).amax(-1, keepdim=True)
    cmax = col.amax(-1, keepdim=True)
    dq_bound = do_q.scale.squeeze(-1) * do_q.data.float().norm(dim=-1) * cv + delta.abs() * cmax
    dq_scale = torch.where(dq_bound > 0, dq_bound / FORMATS["e4m3"][1], torch.ones_like(dq_bound)).unsqueeze(
        -1
    )

    def rnd(t: torch.Tensor, product: str, j0: int) -> torch.Tensor:
        if product == "dq" and not static_dq:
            return per_tile(t, product, j0)
        s = dq_scale if product == "dq" else dk_scale[..., j0 : j0 + t.shape[-1]]
        return (t / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * s

    return rnd


def shared_round(state, dout: torch.Tensor, recipe, softmax_scale: float, scale: str = "bound"):
    """The ``shared`` variants' ``ds_round``: one E4M3 tile
    ``T = E4M3(dS * row_i * col_j / s)`` feeds both products against the raw E4M3 payloads (dQ =
    ``T K8`` times ``s / row_i``, in a kernel's postprocess; dK = ``T^T Q8`` times ``s / col_j``, in
    its epilogue), with one power-of-two scale ``s`` per (query head, block of ``block_n`` keys): a
    CTA's, static. ``scale="bound"`` (``shared``): ``s`` from the bound ``|dS_ij row_i| <= a ||v_j||
    + b`` of :func:`bound_round` times ``col_j``, maxed over the block's keys, over 448;
    ``"block-amax"`` (``shared-amax``, an oracle no kernel has before its loop): the block's true
    amax of ``|dS row col|`` over 448, which prices the bound's looseness; ``"head-amax"``
    (``shared-head-amax``): one scale per query head from the head's true amax (measured by a first
    backward pass here), what delayed scaling (the previous steps' amax, as Transformer Engine scales
    FP8 gradients) would give if the amax did not move between steps; ``"head-bound"``
    (``shared-head-bound``): one scale per query head from :func:`bound_scale`, the deleted CuTe
    backward option ``ds_fp8``'s. The two per-head variants round with
    :func:`shared_tile_round`, that option's definition. As a ``ds_round``
    (``token_scales="ds"``): ``t = dS * col`` for dQ, ``dS * row`` for dK; both round the same ``T``.

    Raises:
        ValueError: an unknown ``scale``."""
    if scale not in ("bound", "block-amax", "head-amax", "head-bound"):
        raise ValueError(
            f"shared_round: scale must be bound, block-amax, head-amax or head-bound, got {scale!r}"
        )
    from fp4_attention.numerics.operands import qk_operands, v_operand
    from fp4_attention.numerics.quant import quantize_fp8

    ops = qk_operands(state.q, state.k, recipe, softmax_scale)
    vo = v_operand(state.v, recipe)
    hkv = ops.k_op.shape[1]
    group = lambda x: x.unflatten(1, (hkv, x.shape[1] // hkv))  # noqa: E731
    v_scale = vo.v_scale.unsqueeze(2)
    do_q = quantize_fp8(group(dout.float()) * v_scale, "e5m2", dims=(-2, -1))
    delta = ((do_q.data.float() * do_q.scale) * group(state.out.float()) / v_scale).sum(-1)
    row = group(ops.row_scale)  # [B, Hkv, G, Sq, 1]
    col = ops.col_scale.unsqueeze(2)  # [B, Hkv, 1, 1, Sk]
    if col.dim() == 4:
        col = col.unsqueeze(-2)
    a = (row.squeeze(-1) * do_q.scale.squeeze(-1) * do_q.data.float().norm(dim=-1)).amax(-1, keepdim=True)
    b = (row.squeeze(-1) * delta.abs()).amax(-1, keepdim=True)
    col_k = col.squeeze(-2)  # [B, Hkv, 1, Sk]
    bound = col_k * (a * vo.v_op.norm(dim=-1).unsqueeze(2) + b)  # [B, Hkv, G, Sk]

    def rnd(t: torch.Tensor, product: str, j0: int) -> torch.Tensor:
        bn = t.shape[-1]
        c = col[..., j0 : j0 + bn]
        x = t * row if product == "dq" else t * c  # dS * row * col, the shared tile
        if scale == "block-amax":
            m = x.abs().amax(dim=(-2, -1), keepdim=True)
        else:
            m = bound[..., j0 : j0 + bn].amax(-1, keepdim=True).unsqueeze(-1)
        sc = pow2_ceil(torch.where(m > 0, m / 448.0, torch.ones_like(m)))
        y = (x / sc).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * sc
        return y / row if product == "dq" else y / c

    q_scale, k_scale = row.squeeze(-1).flatten(1, 2), col.squeeze(-2).squeeze(2)  # [B, Hq, Sq], [B, Hkv, Sk]
    if scale == "head-amax":  # a first pass: the head's amax of |dS row col| over every block
        amaxes = []

        def spy(t: torch.Tensor, product: str, j0: int) -> torch.Tensor:
            if product == "dq":
                amaxes.append((t * row).abs().amax(dim=(-2, -1)))
            return t

        reference_backward(
            state, dout, recipe, causal=True, softmax_scale=softmax_scale, ds_round=spy, token_scales="ds"
        )
        head_amax = torch.stack(amaxes).amax(0).flatten(1, 2)  # [B, Hq]
        s = pow2_ceil(torch.where(head_amax > 0, head_amax / 448.0, torch.ones_like(head_amax)))
        rnd = shared_tile_round(q_scale, k_scale, s)
    elif scale == "head-bound":
        do_norm = (do_q.data.float() * do_q.scale).norm(dim=-1).flatten(1, 2)
        s = bound_scale(q_scale, do_norm, delta.flatten(1, 2), vo.v_op.norm(dim=-1), k_scale)
        rnd = shared_tile_round(q_scale, k_scale, s)
    rnd.bound, rnd.row, rnd.col = bound, row, col  # for the tests
    return rnd


def dk_operand_scale(
    q_scale: torch.Tensor, s_do: torch.Tensor, do8: torch.Tensor, delta: torch.Tensor, v8: torch.Tensor
) -> torch.Tensor:
    """Static per-key scales of an E4M3 dS operand of the dK product (the ``dk-only`` variant; a
    CuTe backward option with these numerics ran on the H200 on 2026-12-02 and lost at the training
    shape, results/cute_prep_h200/): the power of two at or above ``(A ||v8_j|| + B) / 448``, with
    ``A = max_i q_scale_i s_dO ||dO8_i||`` and ``B = max_i q_scale_i |D_i|`` per query head. This
    bounds ``|dS_ij q_scale_i|`` (P <= 1, Cauchy-Schwarz on dP), so that every operand value fits
    E4M3 before the loop starts.

    Args:
        q_scale: FP32 ``[B, Hq, Sq]`` Q token scales; s_do: FP32 ``[B, Hq]``.
        do8: E5M2 ``[B, Hq, Sq, D]``; delta: FP32 ``[B, Hq, >= Sq]`` (padding beyond Sq ignored).
        v8: E4M3 ``[B, Hkv, Sk, D]`` in key order.
    Returns:
        FP32 ``[B, Hq, Sk]``, powers of two (1 where the bound is 0).
    """
    sq = do8.shape[2]
    a = (q_scale * s_do.unsqueeze(-1) * do8.float().norm(dim=-1)).amax(-1, keepdim=True)
    b = (q_scale * delta[..., :sq].abs()).amax(-1, keepdim=True)
    vn = v8.float().norm(dim=-1).repeat_interleave(do8.shape[1] // v8.shape[1], dim=1)  # [B, Hq, Sk]
    bound = a * vn + b
    scale = pow2_ceil(torch.where(bound > 0, bound / 448.0, torch.ones_like(bound)))
    return scale.contiguous()


def dk_only_round(state, dout: torch.Tensor):
    """The ``dk-only`` variant's ``ds_round``: dQ's operand BF16, dK's E4M3 with :func:`dk_operand_scale`."""
    from fp4_attention.backends.dout import quantize_dout

    v_scale = state.v.scale.squeeze(2).contiguous()
    do_q, s_do, delta = quantize_dout(dout, state.out, v_scale)
    scale = dk_operand_scale(state.q.scale.squeeze(-1), s_do, do_q.data, delta, state.v.data)
    hkv = state.v.data.shape[1]
    s_g = scale.unflatten(1, (hkv, -1)).unsqueeze(-2)  # [B, Hkv, G, 1, Sk]

    def rnd(t: torch.Tensor, product: str, j0: int) -> torch.Tensor:
        if product == "dq":
            return t.bfloat16().float()
        sc = s_g[..., j0 : j0 + t.shape[-1]]
        return (t / sc).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * sc

    return rnd


def ds_col_round(state, rec, sm: float):
    """The ``bf16/one-ds-col`` variant (nvfp4qk_fp8pv only: its Q/K token scales are per-head
    constants): one BF16 dS scaled by the K head's scale feeds both products, and dK is rescaled by
    row / col afterwards (a kernel would do it in dK's epilogue). As a ``ds_round``: dQ's operand is
    the definition's ``bf16(dS * col)``; dK's is ``bf16(t * col / row) * row / col`` for ``t = dS *
    row`` (``t * col / row`` equals ``dS * col`` to an FP32 ulp or two)."""
    from fp4_attention.numerics.operands import qk_operands

    ops = qk_operands(state.q, state.k, rec, sm)
    hkv = ops.k_op.shape[1]
    if ops.row_scale.shape[-2] != 1 or ops.col_scale.shape[-1] != 1:
        raise ValueError("bf16/one-ds-col needs per-head Q/K scales (nvfp4qk_fp8pv)")
    row = ops.row_scale.unflatten(1, (hkv, -1))  # [B, Hkv, G, 1, 1]
    ratio = ops.col_scale.unsqueeze(2) / row  # col / row per query head

    def rnd(t: torch.Tensor, product: str, j0: int) -> torch.Tensor:
        if product == "dq":
            return t.bfloat16().float()
        return (t * ratio).bfloat16().float() / ratio

    return rnd


def run(args) -> list[dict]:
    rec = fa.get_recipe(args.recipe)
    if args.recipe != "fp8" and set(args.only or ["all"]) - set(ANY_RECIPE):
        raise ValueError(f"--recipe {args.recipe}: only the variants {ANY_RECIPE} (pass them with --only)")
    sm = args.headdim**-0.5
    rows = []
    # (name, keyword options of reference_backward)
    variants = [("bf16 (definition)", {})] + [
        (f"{fmt}/{gran}", {"ds_round": fp8_round(fmt, gran), "token_scales": "ds"})
        for fmt in ("e4m3", "e5m2")
        for gran in ("tile", "outer")
    ]
    for family in args.families:
        q, k, v, dout, _, (dq64, dk64, _) = float64_case(
            family, 1, args.hq, args.hkv, args.seqlen, args.headdim, args.seed
        )
        out, lse, st = reference_forward(q, k, v, rec, causal=True, softmax_scale=sm)
        state = type(st)(q=st.q, k=st.k, v=st.v, out=out, lse=lse)
        static = []  # the static-scale variants read the fp8 state's token scales
        on_ds = {"token_scales": "ds"}  # the placement the FP8 variants were designed on
        if args.recipe == "fp8":
            static = [
                (f"e4m3/{n}", {"ds_round": bound_round(state, dout, rec, sm, n == "bounds"), **on_ds})
                for n in ("bound", "bounds")
            ]
            static.append(("e4m3/dk-only", {"ds_round": dk_only_round(state, dout), **on_ds}))
            static += [
                (f"e4m3/{n}", {"ds_round": shared_round(state, dout, rec, sm, sc), **on_ds})
                for n, sc in (
                    ("shared", "bound"),
                    ("shared-amax", "block-amax"),
                    ("shared-head-amax", "head-amax"),
                    ("shared-head-bound", "head-bound"),
                )
            ]
        static += [("bf16/scales-in-operands", {"token_scales": "operands"}), ("bf16/scales-on-ds", on_ds)]
        if args.recipe == "nvfp4qk_fp8pv":
            static.append(("bf16/one-ds-col", {"ds_round": ds_col_round(state, rec, sm), **on_ds}))
        for name, kw in (*variants, *static):
            if args.only and name not in args.only:
                continue
            dq, dk, _ = reference_backward(state, dout, rec, causal=True, softmax_scale=sm, **kw)
            row = {"family": family, "dS": name, "dq": _metrics(dq, dq64), "dk": _metrics(dk, dk64)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def to_markdown(rows: list[dict], args, command: str) -> str:
    lines = [
        f"# The dQ/dK operands of the {args.recipe} backward: gradient fidelity (reference backward, CPU)",
        "",
        f"- command: `{command}`",
        f"- date: {_dt.datetime.now(_dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; "
        f"machine {platform.machine()} CPU; torch {torch.__version__}",
        f"- shape: B=1, Hq={args.hq}, Hkv={args.hkv}, S={args.seqlen}, D={args.headdim}, causal; "
        f"recipe {args.recipe}; "
        "cells: cosine / relative L2 against float64 on the same BF16 inputs",
        "",
        "| inputs | dS operand | dQ | dK |",
        "|---|---|---|---|",
    ]
    for r in rows:
        cells = [f"{r[k][0]:.5f} / {r[k][1]:.4f}" for k in ("dq", "dk")]
        lines.append(f"| {r['family']} | {r['dS']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=FAMILIES)
    p.add_argument("--recipe", default="fp8", choices=["fp8", "nvfp4qk_fp8pv"])
    p.add_argument("--only", nargs="*", default=None, help="these dS variants only (names as in the table)")
    p.add_argument("--hq", type=int, default=8)
    p.add_argument("--hkv", type=int, default=2)
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = p.parse_args(argv)
    rows = run(args)
    md = to_markdown(rows, args, shlex.join(["python", "bench/ds_fp8_numerics.py", *(argv or sys.argv[1:])]))
    print(md)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".md").write_text(md)
        Path(args.out + ".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
