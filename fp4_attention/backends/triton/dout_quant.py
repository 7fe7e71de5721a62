"""dO's E5M2 operand, D and the per-query vectors of the FP8 backwards in two Triton kernels (no FP32
copy of dO): the torch definition is ``backends/dout.py`` (``quantize_dout``, ``lse_stat``).

1. ``quant._head_amax_kernel`` (``CHANNEL_SCALED``): the per-(batch, query head) amax of
   ``|dO * v_scale|`` (exact: V's per-channel scale is a power of two) and whether the head holds a
   NaN/Inf, by atomic max.
2. ``_dout_quant_kernel``: per block of queries, the scale ``amax / 57344`` (IEEE division; 1 for an
   all-zero head, NaN and code 0x7F for a non-finite one), the E5M2 codes ``dO * v_scale / s``
   (round to nearest even, clamped), stored row-major and, optionally, transposed with the queries
   of each 16 permuted (``pv_layout.V_PERM16``, the CuTe backward's dV operand); D =
   rowsum((q * s) * O / v_scale) of the same dequantized dO; and the LSE statistic, the Q-scale
   products the CuTe backward reads, zero-padded (stat -inf) to the buffers' length; optionally
   ``BF16(q8 * Q scale * 2^-LIFT)`` from the saved E4M3 Q payload (the CuTe backward's dK operand,
   with the token scale in it: ``reference_backward``'s ``fp8``) in the same pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...numerics.quant import FP8Tensor
from .launch import cdiv, launcher
from .launch import interpreted as _interpreted
from .quant_common import _head_amax_kernel, amax_and_flag_words, check_int32_span, e4m3_to_bf16
from .quant_v import transpose_codes

__all__ = ["DoutOperands", "quantize_dout_fused"]

E5M2_MAX = tl.constexpr(57344.0)  # a jit global must be a constexpr
# the quantizing kernel's launch, queries per program x warps: 16 x 4 took 0.278 ms with the amax pass at
# B4 H32/8 S4096 D128 on the H200, 16 x 8 0.294, 32 x 4 0.325, 32 x 8 0.298, 64 x 4 0.366, 64 x 8 0.301,
# 128 x 8 0.412 (one run, results/prep_transpose_h200/README.md)
QUANT_BLOCK, QUANT_WARPS = 16, 4
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _dout_quant_kernel(
    DO,
    O,
    VS,
    AMAX,
    BAD,
    LSE,
    QS,
    Y,
    YT,
    SDO,
    DELTA,
    STAT,
    R,
    ROW,
    Q8,
    QB,
    H,
    G,
    SQ,
    SQ16,
    SPAD,
    sb,
    sh,
    ss,
    sob,
    soh,
    sos,
    sqsh,
    sqss,
    qk_scale_log2,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    LIFT: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    Q_BF16: tl.constexpr,
):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    i = pid_m * BLOCK + tl.arange(0, BLOCK)
    d = tl.arange(0, D)
    ok = i < SQ
    amax = tl.load(AMAX + bh)
    bad = tl.load(BAD + bh) > 0
    scale = tl.math.div_rn(amax, E5M2_MAX)
    scale = tl.where(amax == 0.0, 1.0, scale)
    scale = tl.where(bad, float("nan"), scale)
    off = b * sb + h * sh + i[:, None] * ss + d[None, :]
    x = tl.load(DO + off, mask=ok[:, None], other=0.0).to(tl.float32)
    off_o = b * sob + h * soh + i[:, None] * sos + d[None, :]
    o = tl.load(O + off_o, mask=ok[:, None], other=0.0).to(tl.float32)
    vs = tl.load(VS + (b * (H // G) + h // G) * D + d)
    y = tl.math.div_rn(x * vs[None, :], scale)
    y = tl.minimum(tl.maximum(y, -E5M2_MAX), E5M2_MAX)
    yq = y.to(tl.float8e5).to(tl.uint8, bitcast=True)
    yq = tl.where(bad, 0x7F, yq).to(tl.uint8)
    yq = tl.where(ok[:, None], yq, 0).to(tl.uint8)
    row_base = bh * SQ * D
    tl.store(Y + row_base + i[:, None] * D + d[None, :], yq, mask=ok[:, None])
    if TRANSPOSED:
        # query i = 8 h + 2 q + c of each 16 goes to slot 4 q + 2 h + c of dO^T (pv_layout.V_PERM16,
        # as V's keys), then a store contiguous along the queries (a store per element at the slot's
        # address would write single bytes D * SQ16 apart); queries past SQ hold code 0 (above), the
        # padding up to SQ16
        yt = transpose_codes(yq, True)
        tl.store(YT + bh * D * SQ16 + d[:, None] * SQ16 + i[None, :], yt, mask=(i < SQ16)[None, :])
    tl.static_assert(TRANSPOSED or not Q_BF16, "Q_BF16 needs TRANSPOSED (the Q scales)")
    if TRANSPOSED:
        qs = tl.load(QS + bh * sqsh + i * sqss, mask=ok, other=0.0)
    if Q_BF16:
        # BF16(q * Q scale * 2^-LIFT) from the E4M3 Q payload (round to nearest even), the B operand
        # of the backward's dK = dS^T Q with the token scale in it
        q8 = tl.load(Q8 + row_base + i[:, None] * D + d[None, :], mask=ok[:, None], other=0)
        qb = (e4m3_to_bf16(q8).to(tl.float32) * (qs * (1.0 / (1 << LIFT)))[:, None]).to(tl.bfloat16)
        tl.store(QB + row_base + i[:, None] * D + d[None, :], qb, mask=ok[:, None])
    deq = yq.to(tl.float8e5, bitcast=True).to(tl.float32) * scale
    delta = tl.sum(deq * o / vs[None, :], 1)
    in_pad = i < SPAD
    tl.store(DELTA + bh * SPAD + i, tl.where(ok, delta, 0.0), mask=in_pad)
    lse = tl.load(LSE + bh * SQ + i, mask=ok, other=float("-inf"))
    stat = tl.where(lse == float("-inf"), float("-inf"), LIFT - lse * LOG2E)
    tl.store(STAT + bh * SPAD + i, stat, mask=in_pad)
    if TRANSPOSED:
        tl.store(R + bh * SPAD + i, qs * qk_scale_log2, mask=in_pad)
        tl.store(ROW + bh * SPAD + i, qs * (1.0 / (1 << LIFT)), mask=in_pad)
    if pid_m == 0:
        tl.store(SDO + bh, scale)


class DoutOperands:
    """What :func:`quantize_dout_fused` returns.

    Attributes:
        do_q: :class:`FP8Tensor` E5M2 ``[B, Hq, Sq, D]``, scale ``[B, Hq, 1, 1]``.
        s_do: FP32 ``[B, Hq]`` (the same values as ``do_q.scale``).
        delta, stat: FP32 ``[B, Hq, S_pad]``; rows past Sq hold 0 and -inf.
        dot: E5M2 ``[B, Hq, D, Sq16]`` dO^T with the ``V_PERM16`` query order (``transposed=True``).
        r, row: FP32 ``[B, Hq, S_pad]`` Q token scale * ``qk_scale_log2`` and * 2^-LIFT
            (``transposed=True``, from ``q_scale``); 0 past Sq.
        qb: BF16 ``[B, Hq, Sq, D]`` = ``BF16(q8 * q_scale * 2^-lift)`` (nearest even; given ``q8``).
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)


def quantize_dout_fused(
    dout: torch.Tensor,
    out: torch.Tensor,
    v_scale: torch.Tensor,
    lse: torch.Tensor,
    *,
    lift: int,
    pad_to: int = 1,
    transposed: bool = False,
    q_scale: torch.Tensor | None = None,
    qk_scale_log2: float = 0.0,
    q8: torch.Tensor | None = None,
    zeroed: torch.Tensor | None = None,
) -> DoutOperands:
    """The FP8 backwards' dO operand and per-query vectors in two passes over dO (module docstring).

    Args:
        dout, out: BF16 ``[B, Hq, Sq, D]``, any strides with a unit last one (each read in place).
        v_scale: FP32 ``[B, Hkv, D]`` (contiguous), powers of two.
        lse: FP32 natural-log LSE ``[B, Hq, Sq]``, contiguous.
        lift: P's lift (log2), for ``stat = lift - LSE log2 e``.
        pad_to: the per-query vectors' length is Sq rounded up to this.
        transposed: also dO^T and the vectors ``r``, ``row`` (the CuTe backward); needs ``q_scale``
            FP32 ``[B, Hq, Sq]``, read through its strides (the per-head NVFP4 global scale expanded
            over the queries is not copied).
        q8: E4M3 ``[B, Hq, Sq, D]`` contiguous (the saved Q payload): also ``qb`` = ``BF16(q8 *
            q_scale * 2^-lift)`` (the CuTe backward's dK operand, ``reference_backward``'s ``fp8``
            placement of the token scales), in the same pass; needs ``transposed``.
        zeroed: a zero-filled CUDA FP32 tensor of ``2 * B * Hq`` elements, contiguous, for the amax
            pass's per-head amax and non-finite flag (the caller's fill of its own accumulators
            covers it: one launch less); default a fill of their own.
    Returns:
        :class:`DoutOperands`. The codes and the scale equal ``backends.dout.quantize_dout``'s bytes
        (the GPU tests check it); D equals its value up to FP32 summation order.
    Raises:
        ValueError: wrong devices, dtypes, shapes or layouts, a head dim that is not a power of two,
            or dO / O spanning 2^31 elements or more (``quant.check_int32_span``).
    """
    b, hq, sq, d = dout.shape
    hkv = v_scale.shape[1]
    if not dout.is_cuda and not _interpreted():
        raise ValueError("quantize_dout_fused: needs CUDA tensors; use backends.dout.quantize_dout on a CPU")
    layout_ok = out.shape == dout.shape and dout.stride(-1) == 1 and out.stride(-1) == 1
    if d & (d - 1) or d > 256 or not layout_ok:
        raise ValueError(
            f"quantize_dout_fused: dout/out must be [B, Hq, Sq, D] of one shape with a unit last stride "
            f"and D a power of two <= 256; got {tuple(dout.shape)} / {tuple(out.shape)}, "
            f"strides {dout.stride()} / {out.stride()}"
        )
    check_int32_span("quantize_dout_fused", dout, out)
    if tuple(v_scale.shape) != (b, hkv, d) or hq % hkv or not v_scale.is_contiguous():
        raise ValueError(f"quantize_dout_fused: v_scale must be contiguous [B, Hkv, D] = {(b, hkv, d)}")
    if transposed and (q_scale is None or tuple(q_scale.shape) != (b, hq, sq)):
        raise ValueError("quantize_dout_fused: transposed=True needs q_scale [B, Hq, Sq]")
    if q8 is not None and (
        q8.dtype != torch.float8_e4m3fn or tuple(q8.shape) != (b, hq, sq, d) or not q8.is_contiguous()
    ):
        raise ValueError(
            f"quantize_dout_fused: q8 must be a contiguous float8_e4m3fn [B, Hq, Sq, D] = {(b, hq, sq, d)}, "
            f"got {q8.dtype} {tuple(q8.shape)}"
        )
    if q8 is not None and not transposed:
        raise ValueError("quantize_dout_fused: q8 needs transposed=True (qb carries the Q scales)")
    dev = dout.device
    spad = -(-sq // pad_to) * pad_to
    sq16 = -(-sq // 16) * 16
    amax, bad = amax_and_flag_words(zeroed, (b * hq,), dev, "quantize_dout_fused")
    # the amax pass's launch: 32 to 256 queries per program, 4 or 8 warps, took the same time on the
    # H200 (results/prep_transpose_h200/README.md)
    block = 64
    grid = (cdiv(sq, block), b * hq)
    strides = (dout.stride(0), dout.stride(1), dout.stride(2))
    launcher(_head_amax_kernel)[grid](
        dout, amax, bad, hq, sq, *strides, D=d, BLOCK_S=block, VS=v_scale, G=hq // hkv, CHANNEL_SCALED=True
    )
    y = torch.empty((b, hq, sq, d), dtype=torch.uint8, device=dev)
    yt = torch.empty((b, hq, d, sq16), dtype=torch.uint8, device=dev) if transposed else y
    s_do = torch.empty((b, hq), dtype=torch.float32, device=dev)
    delta, stat, r, row = torch.empty(
        (4, b, hq, spad), dtype=torch.float32, device=dev
    ).unbind()  # one allocation
    # q_scale read through its strides: a per-token vector, or a per-head scale expanded over the
    # queries (stride 0: NVFP4's global scale), without a copy
    if transposed and (q_scale.stride(0) != hq * q_scale.stride(1) or q_scale.dtype != torch.float32):
        q_scale = q_scale.contiguous().float()
    qs = q_scale if transposed else lse
    q_strides = (q_scale.stride(1), q_scale.stride(2)) if transposed else (sq, 1)
    qb = torch.empty((b, hq, sq, d), dtype=torch.bfloat16, device=dev) if q8 is not None else None
    grid = (cdiv(max(spad, sq16), QUANT_BLOCK), b * hq)
    launcher(_dout_quant_kernel)[grid](
        dout,
        out,
        v_scale,
        amax,
        bad,
        lse.contiguous(),
        qs,
        y,
        yt,
        s_do,
        delta,
        stat,
        r,
        row,
        y if q8 is None else q8.view(torch.uint8),
        dout if qb is None else qb,
        hq,
        hq // hkv,
        sq,
        sq16,
        spad,
        *strides,
        *out.stride()[:3],
        *q_strides,
        float(qk_scale_log2),
        D=d,
        BLOCK=QUANT_BLOCK,
        LIFT=lift,
        TRANSPOSED=transposed,
        Q_BF16=q8 is not None,
        num_warps=QUANT_WARPS,
    )
    do_q = FP8Tensor(data=y.view(torch.float8_e5m2), scale=s_do.view(b, hq, 1, 1))
    extra = dict(dot=yt.view(torch.float8_e5m2), r=r, row=row) if transposed else {}
    if qb is not None:
        extra["qb"] = qb
    return DoutOperands(do_q=do_q, s_do=s_do, delta=delta, stat=stat, **extra)
