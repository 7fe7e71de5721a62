"""The ``triton`` backend: every recipe's forward and the training recipes' backward on CUDA GPUs
with FP8 tensor cores (sm_89+); its declaration is ``SPEC`` in this package's ``__init__``.

Quantization of Q/K/V runs in the Triton quantizers (``quant_fp8.py``, ``quant_v.py``,
``quant_nvfp4.py``; their bytes equal ``numerics.quant``'s;
``tests/backends/test_triton_quant.py``), with the recipe's Q/K rotation (``numerics/rotation.py``)
applied inside them; the backward's dQ/dK are then unrotated from FP32 by
``rotation.unrotate_rows``. RoPE (``attention(..., rope=...)``) is applied inside the per-token FP8
and the NVFP4 Q/K quantizers (``rope.py``), by ``rope.rope_rows_pair`` (Q and K in one launch)
before the others; dO is quantized to E5M2 with ``numerics.quant.quantize_fp8`` on the GPU. The
attention products run in ``kernels.py``. Forward saves the quantized payloads and scales, the
output and the LSE, never BF16 Q/K/V (for the FP8 recipes); its :class:`SavedState` holds V8
transposed, ``[B, Hkv, D, Sk]`` (the K-major B operand of the FP8 PV product).

Supported: head dims 64 and 128; any sequence lengths, causal (bottom-right) or not, GQA. The
Direct-P recipes (``nvfp4qk_mxfp4pv_fast`` / ``_accurate``, forward only) run in the same forward
kernel (``DIRECT_P``). Tile choices cite the committed measurements in ``results/``.
"""

from __future__ import annotations

import torch
import triton

from ...numerics.operands import Saved, SavedState, quantize_qk, quantize_v, v_operand
from ...numerics.quant import FP8Tensor, NVFP4Tensor, nvfp4_global_scale
from ...numerics.recipes import Recipe
from ..base import UnsupportedError
from ..dout import lse_stat
from ..layouts import empty_in_layout_of
from . import SPEC
from .dout_quant import quantize_dout_fused
from .kernels import LOG2E, _bwd_dkdv_kernel, _bwd_dq_kernel, _fwd_kernel
from .quant_fp8 import quantize_fp8_key_groups, quantize_fp8_rows, quantize_fp8_rows_pair
from .quant_nvfp4 import decode_nvfp4_rows, quantize_nvfp4_heads, quantize_nvfp4_rows
from .quant_v import quantize_fp8_v_transposed
from .rope import quantize_fp8_rows_pair_rope, quantize_nvfp4_heads_rope, rope_rows_pair
from .rotation import rotated_row_amax, unrotate_rows

__all__ = ["TritonBackend", "forward_operands", "launch_forward"]

# FP8 QK: None, Triton's default accumulation (no FP32 promotion inside the head dim's chain of k32
# MMAs: the fp8 recipe's definition, kernels.py); bench/tune_fwd.py sets 32 to time the promotion
IMPRECISE_K = None
# Backward tiles (BLOCK_M, BLOCK_N, warps, stages) of the dK/dV and the dQ kernel (bench/tune_fwd.py)
# dK/dV (program per query head): (64, 128, 8, 2) was the fastest of 4 on the H200 (B4 H32/8 S4096 causal
# fp8 backward 11.35 ms vs 11.74 (64, 64, 4, 2) and 13.82 (64, 64, 8, 2), the one tile without register
# spills; results/tune_bwd_h200.md)
BWD_DKDV_TILES = (64, 128, 8, 2)
BWD_DQ_TILES = (64, 64, 4, 2)


def default_fwd_tiles(head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_M, warps, stages) of the forward kernel. Head dim 128: 64 query rows on one warpgroup,
    3 stages (H200, results/tune_fwd_h200.md, fp8 kernel-only: 456 TFLOP/s at B4 H32/8 S4096
    causal and 515 at B2 H32/32 S8192, vs 432 / 482 with 128 rows on two warpgroups)."""
    return (64, 4, 3) if head_dim > 64 else (128, 8, 3)


def default_block_n(head_dim: int) -> int:
    """Keys per KV tile of the forward kernel (the reference must use the same to compare
    rounding-for-rounding: FP8 P is rounded relative to the running max of its tile)."""
    return 128 if head_dim <= 64 else 64


def _quantize_qk_fast(q, k, recipe: Recipe, rope=None):
    """Quantize Q/K with the Triton quantizers (bytes equal ``operands.quantize_qk``, the recipe's
    Q/K rotation included: rotated inside the quantizer kernels). With ``rope`` (a ``RoPETables``)
    those of the RoPE'd Q/K: applied inside the per-token FP8 quantizer of Q and K
    (``rope.quantize_fp8_rows_pair_rope``) and the NVFP4 one (``rope.quantize_nvfp4_heads_rope``);
    with a Q/K rotation, K per group of keys, or BF16 Q/K by ``rope.rope_rows_pair`` first.

    Returns ``(q_saved, k_saved, decoded)`` where ``decoded`` is the BF16 ``s_b * q`` pair for NVFP4.
    """
    rot = recipe.qk_rotation
    signs = None if rot is None else rot.signs(q.shape[-1], q.device)
    if rope is not None:
        if recipe.qk == "fp8" and recipe.k_scale_keys == 1 and rot is None:
            qk = quantize_fp8_rows_pair_rope(q, k, (rope.cos_q, rope.sin_q), (rope.cos_k, rope.sin_k))
            return (*qk, None)
        if recipe.qk == "nvfp4" and rot is None:  # RoPE in both passes of the NVFP4 quantizer
            q_s, q_dec, _ = quantize_nvfp4_heads_rope(q, rope.cos_q, rope.sin_q)
            k_s, k_dec, _ = quantize_nvfp4_heads_rope(k, rope.cos_k, rope.sin_k)
            return q_s, k_s, (q_dec, k_dec)
        q, k = rope_rows_pair(q, k, (rope.cos_q, rope.sin_q), (rope.cos_k, rope.sin_k))
    if recipe.qk == "fp8":  # read in place from any [B, H, S, D] strides
        if recipe.k_scale_keys == 1:  # Q and K per token, in one launch
            return (*quantize_fp8_rows_pair(q, k, signs=signs), None)
        return (
            quantize_fp8_rows(q, signs=signs),
            quantize_fp8_key_groups(k, recipe.k_scale_keys, signs=signs),
            None,
        )
    if recipe.qk == "nvfp4":  # the quantizers read Q/K in place; the rotation's amax needs rows
        if signs is None:  # the per-head global scale formed in the kernels
            (q_s, q_dec, _), (k_s, k_dec, _) = quantize_nvfp4_heads(q), quantize_nvfp4_heads(k)
            return q_s, k_s, (q_dec, k_dec)
        q, k = q.contiguous(), k.contiguous()
        # the per-head scale of the rotated tensor: amax over its rows' rotated amaxes
        g_q = nvfp4_global_scale(rotated_row_amax(q, signs), dims=(2, 3))
        g_k = nvfp4_global_scale(rotated_row_amax(k, signs), dims=(2, 3))
        q_s, q_dec = quantize_nvfp4_rows(q, g_q, signs=signs)
        k_s, k_dec = quantize_nvfp4_rows(k, g_k, signs=signs)
        return q_s, k_s, (q_dec, k_dec)
    q_s, k_s = quantize_qk(q, k, recipe)
    return q_s, k_s, None


def _qk_kernel_operands(q_s: Saved, k_s: Saved, recipe: Recipe, shape_q, shape_k, decoded=None):
    """(q_op, k_op, row [B, Hq, Sq], col [B, Hkv, Sk]) as the kernels read them."""
    b, hq, sq, _ = shape_q
    hkv, sk = shape_k[1], shape_k[2]
    if recipe.qk == "bf16":
        one = torch.ones((), dtype=torch.float32, device=q_s.device)
        return q_s, k_s, one.expand(b, hq, sq), one.expand(b, hkv, sk)
    if recipe.qk == "fp8":
        return q_s.data, k_s.data, q_s.scale.squeeze(-1), k_s.scale.squeeze(-1)
    if recipe.qk == "nvfp4":
        # s_b * q is exact in BF16 (<= 6 significant bits, in range): the exact emulation of the
        # NVFP4 QK product is a BF16 MMA of the decoded payloads, scaled by the global scales.
        if decoded is not None:
            q_op, k_op = decoded
        else:
            q_op, k_op = decode_nvfp4_rows(q_s), decode_nvfp4_rows(k_s)
        return (
            q_op,
            k_op,
            q_s.global_scale.squeeze(-1).expand(b, hq, sq),
            k_s.global_scale.squeeze(-1).expand(b, hkv, sk),
        )
    raise UnsupportedError(f"triton backend: Q/K format {recipe.qk!r} not implemented")


def _v_kernel_operands(v_s: Saved, recipe: Recipe, b: int, hkv: int, d: int, device):
    """(v_op [B, Hkv, Sk, D] view, v_scale [B, Hkv, D])."""
    if recipe.pv == "fp8":
        return v_s.data.transpose(-1, -2), v_s.scale.squeeze(2)
    one = torch.ones((), dtype=torch.float32, device=device)
    return v_s, one.expand(b, hkv, d)


def forward_operands(q_s: Saved, k_s: Saved, v_s: Saved, recipe: Recipe, shape_q, shape_k, decoded=None):
    """The forward kernel's operands ``(q_op, k_op, v_op, row, col, v_scale)`` (see :func:`launch_forward`)
    from quantized Q/K/V as :class:`SavedState` holds them (V8 stored ``[B, Hkv, D, Sk]``).
    ``decoded``: the BF16 ``s_b * q`` pair of NVFP4 Q/K when already at hand (else decoded here)."""
    b, _, _, d = shape_q
    hkv = shape_k[1]
    q_op, k_op, row, col = _qk_kernel_operands(q_s, k_s, recipe, shape_q, shape_k, decoded)
    if recipe.direct_p is not None:
        v_op = v_operand(v_s, recipe).v_op.to(torch.bfloat16)  # alpha_V * q_V, exact; [B, Hkv, Sk32, D]
        v_scale = torch.ones((), dtype=torch.float32, device=q_op.device).expand(b, hkv, d)
    else:
        v_op, v_scale = _v_kernel_operands(v_s, recipe, b, hkv, d, q_op.device)
    return q_op, k_op, v_op, row, col, v_scale


def launch_forward(
    q_op,
    k_op,
    v_op,
    row,
    col,
    v_scale,
    recipe: Recipe,
    *,
    causal: bool,
    softmax_scale: float,
    seq_k: int,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    split: bool = True,
    out_layout_of: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the forward kernel on prepared operands (see ``triton_kernels``): q_op ``[B, Hq, Sq, D]``,
    k_op ``[B, Hkv, Sk, D]``, v_op a ``[B, Hkv, >=Sk, D]`` view, row ``[B, Hq, Sq]``, col
    ``[B, Hkv, Sk]``, v_scale ``[B, Hkv, D]``. Returns BF16 out ``[B, Hq, Sq, D]`` and FP32 LSE.
    ``split=False`` masks every KV tile (the kernel before the unmasked fast path; for benchmarks).
    ``out_layout_of``: a ``[B, Hq, Sq, D]`` tensor (the caller's q) whose memory order the output
    takes (``layouts.empty_in_layout_of``); default contiguous."""
    b, hq, sq, d = q_op.shape
    hkv = k_op.shape[1]
    tile_m, warps, stages = default_fwd_tiles(d)
    block_m, num_warps, num_stages = block_m or tile_m, num_warps or warps, num_stages or stages
    if out_layout_of is None:
        out = torch.empty((b, hq, sq, d), dtype=torch.bfloat16, device=q_op.device)
    else:
        out = empty_in_layout_of(out_layout_of, (b, hq, sq, d))
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q_op.device)
    dp = recipe.direct_p
    direct_p = {} if dp is None else dict(DIRECT_P=True, DP_A=dp.a, DP_B=dp.b, DP_EXACT_EVERY=dp.exact_every)
    _fwd_kernel[(triton.cdiv(sq, block_m), b * hq)](
        q_op,
        k_op,
        v_op,
        row,
        col,
        v_scale,
        out,
        lse,
        *q_op.stride(),
        *k_op.stride(),
        *v_op.transpose(-1, -2).stride(),
        *row.stride(),
        *col.stride(),
        *v_scale.stride(),
        *out.stride(),
        *lse.stride(),
        hq,
        hq // hkv,
        sq,
        seq_k,
        softmax_scale * LOG2E,
        HEAD_DIM=d,
        BLOCK_M=block_m,
        BLOCK_N=block_n or default_block_n(d),
        CAUSAL=causal,
        QK_FP8=recipe.qk == "fp8",
        PV_FP8=recipe.pv == "fp8",
        LIFT=recipe.p_lift_log2,
        IMPRECISE=IMPRECISE_K if recipe.qk == "fp8" else None,
        SPLIT=split,
        **direct_p,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out, lse


class TritonBackend:
    """Triton kernels for the training recipes; options ``block_m``, ``block_n``, ``num_warps``,
    ``num_stages`` (forward tiles; None = :func:`default_fwd_tiles`, :func:`default_block_n`) are for
    benchmarking and tests."""

    spec = SPEC

    def forward(
        self,
        q,
        k,
        v,
        recipe: Recipe,
        *,
        causal: bool,
        softmax_scale: float,
        block_m: int | None = None,
        block_n: int | None = None,
        num_warps: int | None = None,
        num_stages: int | None = None,
        rope=None,
    ):
        sk = k.shape[2]
        q_s, k_s, decoded = _quantize_qk_fast(q, k, recipe, rope)
        if recipe.pv == "fp8":  # V8 stored transposed: the K-major B operand of the FP8 PV product
            v_s = quantize_fp8_v_transposed(v)
        else:
            v_s = quantize_v(v, recipe)
        ops = forward_operands(q_s, k_s, v_s, recipe, q.shape, k.shape, decoded)
        out, lse = launch_forward(
            *ops,
            recipe,
            causal=causal,
            softmax_scale=softmax_scale,
            seq_k=sk,
            block_m=block_m,
            block_n=block_n,
            num_warps=num_warps,
            num_stages=num_stages,
            out_layout_of=q,  # the output in the caller's layout: no copy on the way back
        )
        return out, lse, SavedState(q=q_s, k=k_s, v=v_s, out=out, lse=lse)

    def backward(
        self,
        state: SavedState,
        dout,
        recipe: Recipe,
        *,
        causal: bool,
        softmax_scale: float,
        block_m: int | None = None,
        block_n: int | None = None,
        num_warps: int | None = None,
        num_stages: int | None = None,
        dlse: torch.Tensor | None = None,
    ):
        """dQ, dK, dV (BF16) from the saved state. ``block_m``... are the forward's tile options (the
        attention options reach both passes); the backward tiles are ``BWD_DKDV_TILES`` / ``BWD_DQ_TILES``.
        ``dlse``: the LSE's gradient, FP32 ``[B, Hq, Sq]``, or None; it enters as ``D - dlse``
        (``reference_backward``'s rule), subtracted from D before the kernels read it."""
        b, hq, sq, d = state.out.shape
        shape_k = (b, *_kv_shape(state.k, recipe))
        hkv, sk = shape_k[1], shape_k[2]
        g = hq // hkv
        q_op, k_op, row, col = _qk_kernel_operands(state.q, state.k, recipe, state.out.shape, shape_k)
        lift = recipe.p_lift_log2
        if recipe.pv == "fp8":
            # V^T as saved, read through its strides as the forward does (no copy)
            v_op, v_scale = _v_kernel_operands(state.v, recipe, b, hkv, d, dout.device)
            dv_ops = quantize_dout_fused(dout, state.out, v_scale.contiguous(), state.lse, lift=lift)
            do_op, s_do, delta = dv_ops.do_q.data, dv_ops.s_do, dv_ops.delta
        else:
            v_op = state.v
            v_scale = torch.ones((), dtype=torch.float32, device=dout.device).expand(b, hkv, d)
            do_op, s_do = dout, torch.ones((), dtype=torch.float32, device=dout.device).expand(b, hq)
            delta = (dout.float() * state.out.float()).sum(-1)
        stat, delta = lse_stat(state.lse, lift), delta.contiguous()
        if dlse is not None:  # D is this call's own tensor
            delta[..., :sq].sub_(dlse)
        rot = recipe.qk_rotation
        # with a Q/K rotation the kernels write dQ/dK of the rotated basis in FP32; unrotated below
        # BF16 gradients the kernels write directly are allocated in the layout of the forward's
        # output, the caller's (no copy on the way back)
        if rot is None:
            dq = empty_in_layout_of(state.out, (b, hq, sq, d))
        else:  # FP32 of the rotated basis, unrotated below (contiguous rows)
            dq = torch.empty((b, hq, sq, d), dtype=torch.float32, device=dout.device)
        # dK/dV per query head: FP32 partials summed over the GQA group below (BF16 directly for MHA)
        dkv_dtype = torch.float32 if g > 1 else torch.bfloat16
        dk_dtype = torch.float32 if rot is not None else dkv_dtype
        if rot is None:  # one layout for both (the kernel takes dk's strides for dv)
            dk = empty_in_layout_of(state.out, (b, hq, sk, d), dk_dtype)
            dv = empty_in_layout_of(state.out, (b, hq, sk, d), dkv_dtype)
        else:
            dk = torch.empty((b, hq, sk, d), dtype=dk_dtype, device=dout.device)
            dv = torch.empty((b, hq, sk, d), dtype=dkv_dtype, device=dout.device)  # same strides as dk
        common = dict(
            HEAD_DIM=d,
            CAUSAL=causal,
            QK_FP8=recipe.qk == "fp8",
            PV_FP8=recipe.pv == "fp8",
            LIFT=lift,
            IMPRECISE=IMPRECISE_K if recipe.qk == "fp8" else None,
        )
        bm, bn, nw, ns = BWD_DKDV_TILES
        _bwd_dkdv_kernel[(triton.cdiv(sk, bn), b * hq)](
            q_op,
            k_op,
            v_op,
            row,
            col,
            do_op,
            stat,
            delta,
            s_do,
            v_scale,
            dk,
            dv,
            *q_op.stride(),
            *k_op.stride(),
            *v_op.stride(),
            *row.stride(),
            *col.stride(),
            *do_op.stride(),
            *stat.stride(),
            *s_do.stride(),
            *v_scale.stride(),
            *dk.stride(),
            hq,
            g,
            sq,
            sk,
            softmax_scale * LOG2E,
            softmax_scale,
            BLOCK_M=bm,
            BLOCK_N=bn,
            num_warps=nw,
            num_stages=ns,
            **common,
        )
        if g > 1:
            dk = dk.view(b, hkv, g, sk, d).sum(2)
            dk = dk if rot is not None else dk.to(torch.bfloat16)
            dv = dv.view(b, hkv, g, sk, d).sum(2).to(torch.bfloat16)
        bm, bn, nw, ns = BWD_DQ_TILES
        _bwd_dq_kernel[(triton.cdiv(sq, bm), b * hq)](
            q_op,
            k_op,
            v_op,
            row,
            col,
            do_op,
            stat,
            delta,
            s_do,
            dq,
            *q_op.stride(),
            *k_op.stride(),
            *v_op.stride(),
            *row.stride(),
            *col.stride(),
            *do_op.stride(),
            *stat.stride(),
            *s_do.stride(),
            *dq.stride(),
            hq,
            g,
            sq,
            sk,
            softmax_scale * LOG2E,
            softmax_scale,
            BLOCK_M=bm,
            BLOCK_N=bn,
            num_warps=nw,
            num_stages=ns,
            **common,
        )
        if rot is not None:  # dQ H^T, dK H^T from FP32, written as BF16 (one small kernel each)
            signs = rot.signs(d, dout.device)
            dq, dk = unrotate_rows(dq, signs), unrotate_rows(dk.contiguous(), signs)
        return dq, dk, dv


def _kv_shape(k_s: Saved, recipe: Recipe) -> tuple[int, int, int]:
    if isinstance(k_s, NVFP4Tensor):
        return k_s.shape[1:]
    if isinstance(k_s, FP8Tensor):
        return tuple(k_s.data.shape[1:])
    return tuple(k_s.shape[1:])
