"""Triton kernels of the training recipes: forward, backward (dK/dV and dQ), on Hopper and newer.

Design note
-----------
Every recipe is one instance of the same two products (``operands.py``):

    z_ij = (q_op_i . k_op_j) * row_i * col_j * (softmax_scale * log2 e)      QK on tensor cores
    O_i  = (sum_j P_ij v_op_j) / l_i * v_scale                               PV on tensor cores

* ``QK_FP8``: q_op/k_op are E4M3 (``fp8``: per-token FP32 row/col scales) and the QK product is an
  FP8 MMA (QGMMA on Hopper); otherwise they are BF16: the BF16 inputs (``bf16``, scales 1) or
  NVFP4 ``s_b * q`` decoded to BF16 once per call, which is exact (``nvfp4qk_fp8pv``: per-head
  global scales as row/col scales through stride-0 views). The decode is O(S D), the attention
  O(S^2 D), so the emulation costs one BF16 MMA where Blackwell would run an FP4 one.
* ``PV_FP8``: P is lifted by 2^LIFT (LIFT = 8) and converted to E4M3 with the hardware's
  round-to-nearest satfinite conversion; V is E4M3 stored transposed, ``[B, Hkv, D, Sk]``, which
  is the K-major layout the FP8 B operand of the PV MMA needs. Otherwise P and V are BF16.
* Hopper's FP8 MMA accumulates with reduced precision (~22 bits, contract §2) and Triton's default
  on sm_90 never promotes. The FP8 QK product is not promoted (``IMPRECISE`` None: the ``fp8``
  recipe's definition, as in the CuTe kernels, FA3, cuDNN and SageAttention): its scores carry the
  MMA's accumulation error, at most 2^-10.9 of ``sum_d |q8 k8|`` on the H200
  (results/robustness_h200/qk_accumulation_h200.md); forward and backward run the same chain, so
  they recompute the same scores. ``IMPRECISE`` = 32 promotes every 32 elements of the head dim
  (``max_num_imprecise_acc``; bench/tune_fwd.py times it). The PV product of each KV tile is taken
  into a fresh FP32 value and added to the running FP32 accumulator (promotion once per KV tile).
* Backward: ``_bwd_dkdv`` (one program per KV block and query head, looping over its query blocks;
  the GQA group's FP32 partials are summed after it) and ``_bwd_dq`` (one program per query block
  and head).
  Both rebuild the lifted P from the saved LSE statistic; dV and dP are FP8 MMAs of E4M3 P / V with
  E5M2 dO; dQ and dK are BF16 MMAs of BF16 dS: for ``QK_FP8`` one BF16 dS with the token scales
  in the BF16 Q/K operands (``bf16(q8 * row)``, ``bf16(k8 * col)``), otherwise ``bf16(dS * col)``
  and ``bf16(dS * row)`` on the exact Q/K operands (``reference_backward``'s ``token_scales``). No
  Sq x Sk tensor is ever stored.
* ``DIRECT_P`` (forward-only MXFP4 recipes): ``_direct_p_tile`` classifies each 32-key block of the
  score tile into E2M1 codes (``direct_p.py``), with the integer row anchor; P's represented values
  2^(e_B - m) q and V's alpha_V q_V are exact in BF16, so the PV product is a BF16 MMA (Hopper has
  no FP4 MMA) and the 1/36 is applied once after it.

Numerics are those of ``reference.py``; a kernel differs from it by FP32 accumulation order only
(and, through it, by the E4M3 rounding of the few P values that land within an ulp of a boundary).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .quant_nvfp4 import _e2m1_code, _e2m1_value

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _fwd_tiles(
    acc,
    l_i,
    m_i,
    q,
    row,
    qk,
    k_base,
    v_base,
    col_base,
    offs_m,
    offs_d,
    offs_n0,
    start,
    stop,
    skn,
    skd,
    svn,
    svd,
    scn,
    SEQ_K,
    shift,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    PER_TOKEN_SCALES: tl.constexpr,
    PV_FP8: tl.constexpr,
    LIFT: tl.constexpr,
    IMPRECISE: tl.constexpr,
    DIRECT_P: tl.constexpr,
    DP_A: tl.constexpr,
    DP_B: tl.constexpr,
    DP_EXACT_EVERY: tl.constexpr,
):
    """KV tiles ``[start, stop)`` of one query block (online softmax). ``MASKED`` tiles apply the
    key-range and causal masks; the others are whole tiles fully visible to every row of the block.

    Scores in log2 units: per-head scales (bf16, nvfp4: ``qk`` = row * col * softmax_scale * log2 e,
    one scalar) give ``z = dot * qk``; ``PER_TOKEN_SCALES`` (fp8) give ``z = (dot * col) * row`` with
    ``row`` already holding softmax_scale * log2 e. The row max is taken before the row scale is
    applied (scales are > 0, and rounding is monotone, so max(t) * r == max(t * r)), and
    ``exp2(t * r - m)`` is one FMA: the FP32 rounding of the exponent argument may differ from the
    reference's by an ulp (an FP32 order difference, like the MMA's accumulation order)."""
    for start_n in tl.range(start, stop, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < SEQ_K
        if MASKED:
            kt = tl.load(
                k_base + offs_n[None, :] * skn + offs_d[:, None] * skd, mask=n_ok[None, :], other=0.0
            )
        else:
            kt = tl.load(k_base + offs_n[None, :] * skn + offs_d[:, None] * skd)
        t = tl.dot(q, kt, max_num_imprecise_acc=IMPRECISE)
        if not PER_TOKEN_SCALES:
            r = qk
        else:
            if MASKED:
                col = tl.load(col_base + offs_n * scn, mask=n_ok, other=0.0)
            else:
                col = tl.load(col_base + offs_n * scn)
            t = t * col[None, :]
            r = row[:, None]
        if MASKED:
            valid = n_ok[None, :]
            if CAUSAL:
                valid = valid & (offs_n[None, :] <= offs_m[:, None] + shift)
            t = tl.where(valid, t, float("-inf"))
        # V tile [BLOCK_N, D] read from the transposed [D, Sk] storage: contiguous along the
        # contraction dim (K-major), as the FP8 B operand requires.
        if MASKED:
            v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=n_ok[:, None], other=0.0)
        else:
            v = tl.load(v_base + offs_n[:, None] * svn + offs_d[None, :] * svd)
        if DIRECT_P:
            p, l_tile, m_new = _direct_p_tile(
                t * r, m_i, start_n, BLOCK_M, BLOCK_N, DP_A, DP_B, DP_EXACT_EVERY
            )
            alpha = tl.where(
                m_new == m_i, 1.0, tl.math.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))
            )
            l_i = l_i * alpha + l_tile
            pv = tl.dot(p.to(tl.bfloat16), v)  # 2^rel q and alpha_V q_V are exact in BF16
        else:
            if PER_TOKEN_SCALES:
                m_tile = tl.max(t, 1) * row
            else:
                m_tile = tl.max(t, 1) * qk
            m_new = tl.maximum(m_i, m_tile)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.where(m_new == m_i, 1.0, tl.math.exp2(m_i - m_safe))
            p = tl.math.exp2(tl.fma(t, r, (LIFT - m_safe)[:, None]))
            l_i = l_i * alpha + tl.sum(p, 1)
            if PV_FP8:
                pv = tl.dot(p.to(tl.float8e4nv), v)
            else:
                pv = tl.dot(p.to(tl.bfloat16), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    ROW,
    COL,
    VSCALE,
    O,
    LSE,
    sqb,
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svd,
    svn,
    srb,
    srh,
    srm,
    scb,
    sch,
    scn,
    svsb,
    svsh,
    svsd,
    sob,
    soh,
    som,
    sod,
    slb,
    slh,
    slm,
    H_Q,
    GROUP,
    SEQ_Q,
    SEQ_K,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    QK_FP8: tl.constexpr,
    PV_FP8: tl.constexpr,
    LIFT: tl.constexpr,
    IMPRECISE: tl.constexpr,
    DIRECT_P: tl.constexpr = False,
    DP_A: tl.constexpr = 1.5,
    DP_B: tl.constexpr = 1.2,
    DP_EXACT_EVERY: tl.constexpr = 0,
    SPLIT: tl.constexpr = True,
):
    """One program per (query block, batch x query head). ``SPLIT``: the whole, fully visible KV
    tiles run without masks, the rest (causal diagonal band, ragged last tile) with them; the tiles
    and their order are the same either way. Causal: the heaviest query blocks are launched first."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = pid_bh // H_Q
    h = pid_bh % H_Q
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n0 = tl.arange(0, BLOCK_N)
    m_ok = offs_m < SEQ_Q

    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd, mask=m_ok[:, None], other=0.0
    )
    col_base = COL + b * scb + hk * sch
    if QK_FP8:  # per-token row/col scales
        row = tl.load(ROW + b * srb + h * srh + offs_m * srm, mask=m_ok, other=0.0) * qk_scale_log2
        qk = 1.0
    else:  # bf16 (ones) and nvfp4 (global scales): one value per head
        row = tl.load(ROW + b * srb + h * srh) * qk_scale_log2
        qk = row * tl.load(col_base)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    shift = SEQ_K - SEQ_Q  # bottom-right causal alignment
    hi = SEQ_K
    lo = (SEQ_K // BLOCK_N) * BLOCK_N  # whole tiles
    if CAUSAL:
        hi = tl.maximum(tl.minimum(SEQ_K, (pid_m + 1) * BLOCK_M + shift), 0)
        # tiles [n, n + BLOCK_N) with n + BLOCK_N - 1 <= first row + shift are visible to every row
        lo = tl.minimum(lo, (tl.maximum(pid_m * BLOCK_M + shift + 1, 0) // BLOCK_N) * BLOCK_N)
        lo = tl.minimum(lo, hi)
    if not SPLIT:
        lo = 0
    acc, l_i, m_i = _fwd_tiles(
        acc,
        l_i,
        m_i,
        q,
        row,
        qk,
        k_base,
        v_base,
        col_base,
        offs_m,
        offs_d,
        offs_n0,
        0,
        lo,
        skn,
        skd,
        svn,
        svd,
        scn,
        SEQ_K,
        shift,
        BLOCK_M,
        BLOCK_N,
        False,
        CAUSAL,
        QK_FP8,
        PV_FP8,
        LIFT,
        IMPRECISE,
        DIRECT_P,
        DP_A,
        DP_B,
        DP_EXACT_EVERY,
    )
    acc, l_i, m_i = _fwd_tiles(
        acc,
        l_i,
        m_i,
        q,
        row,
        qk,
        k_base,
        v_base,
        col_base,
        offs_m,
        offs_d,
        offs_n0,
        lo,
        hi,
        skn,
        skd,
        svn,
        svd,
        scn,
        SEQ_K,
        shift,
        BLOCK_M,
        BLOCK_N,
        True,
        CAUSAL,
        QK_FP8,
        PV_FP8,
        LIFT,
        IMPRECISE,
        DIRECT_P,
        DP_A,
        DP_B,
        DP_EXACT_EVERY,
    )

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    vs = tl.load(VSCALE + b * svsb + hk * svsh + offs_d * svsd)
    if DIRECT_P:  # the two 1/6 of P and V, once, after the PV product (contract §1)
        acc = tl.math.div_rn(acc, tl.full([BLOCK_M, HEAD_DIM], 36.0, tl.float32))
    out = acc / l_safe[:, None] * vs[None, :]
    out = tl.where(empty[:, None], 0.0, out)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe) - LIFT) * 0.6931471805599453)
    tl.store(
        O + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
        out.to(tl.bfloat16),
        mask=m_ok[:, None],
    )
    tl.store(LSE + b * slb + h * slh + offs_m * slm, lse, mask=m_ok)


@triton.jit
def _pow2_int(e):
    """Exact 2^e for integer-valued float e in [-127, 0] (bit construction; ex2.approx is not
    guaranteed exact); 0 for e < -127 (no E8M0 scale: the block is flushed, contract §2)."""
    ec = tl.where(e >= -127.0, e, -200.0).to(tl.int32)
    bits = tl.where(ec >= -126, (ec + 127) << 23, tl.where(ec == -127, 1 << 22, 0))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _direct_p_tile(
    z,
    m_i,
    start_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DP_A: tl.constexpr,
    DP_B: tl.constexpr,
    DP_EXACT_EVERY: tl.constexpr,
):
    """Direct-P on one tile of scores ``z`` (log2 units, masked = -inf), as ``direct_p.p_codes``:
    returns the represented P (2^(e_B - m) q, [M, N]), the tile's represented denominator
    sum_B 2^(e_B - m) (sum q / 6) and the new integer anchor m."""
    NB: tl.constexpr = BLOCK_N // 32
    zb = tl.reshape(z, [BLOCK_M, NB, 32])
    e_b = tl.math.ceil(tl.max(zb, 2))
    empty = e_b == float("-inf")
    x = zb - tl.where(empty, 0.0, e_b)[:, :, None] + 2.584962500721156
    x = tl.where(empty[:, :, None], float("-inf"), x)
    q = _e2m1_value(_e2m1_code(tl.minimum(tl.maximum(DP_A * x + DP_B, 0.0), 6.0)))
    if DP_EXACT_EVERY > 0:
        key = start_n + tl.reshape(tl.arange(0, BLOCK_N), [NB, 32])
        exact = _e2m1_value(_e2m1_code(tl.minimum(tl.math.exp2(x), 6.0)))
        q = tl.where((key % DP_EXACT_EVERY == 0)[None, :, :], exact, q)
    m_new = tl.maximum(m_i, tl.max(e_b, 1))
    anchor = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = _pow2_int(e_b - anchor[:, None])
    csum = tl.sum(q, 2)
    l_tile = tl.sum(alpha * tl.math.div_rn(csum, tl.full([BLOCK_M, NB], 6.0, tl.float32)), 1)
    # a NaN score (a NaN/Inf in Q or K poisons its NVFP4 group) poisons its row, as in the reference
    # (direct_p.p_codes: a NaN block exponent); Triton's max drops NaN, so it is carried explicitly
    nan_row = tl.max(tl.max((zb != zb).to(tl.int32), 2), 1) > 0
    l_tile = tl.where(nan_row, float("nan"), l_tile)
    p = tl.reshape(alpha[:, :, None] * q, [BLOCK_M, BLOCK_N])
    return p, l_tile, m_new


@triton.jit
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    ROW,
    COL,
    DO,
    STAT,
    DELTA,
    SDO,
    VSCALE,
    DK,
    DV,
    sqb,
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    srb,
    srh,
    srm,
    scb,
    sch,
    scn,
    sdob,
    sdoh,
    sdom,
    sdod,
    stb,
    sth,
    stm,
    ssb,
    ssh,
    svsb,
    svsh,
    svsd,
    sdkb,
    sdkh,
    sdkn,
    sdkd,
    H_Q,
    GROUP,
    SEQ_Q,
    SEQ_K,
    qk_scale_log2,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    QK_FP8: tl.constexpr,
    PV_FP8: tl.constexpr,
    LIFT: tl.constexpr,
    IMPRECISE: tl.constexpr,
):
    """dK, dV of one KV block for ONE query head (program per KV block and batch x query head):
    two FP32 accumulators, dO's per-head scale applied once at the end. DK/DV are indexed by the
    query head: the caller sums the GROUP query heads of a KV head (FP32 partials) when GROUP > 1."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H_Q
    h = pid_bh % H_Q
    hk = h // GROUP
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_m0 = tl.arange(0, BLOCK_M)
    n_ok = offs_n < SEQ_K
    shift = SEQ_K - SEQ_Q

    k = tl.load(
        K + b * skb + hk * skh + offs_n[:, None] * skn + offs_d[None, :] * skd, mask=n_ok[:, None], other=0.0
    )
    v = tl.load(
        V + b * svb + hk * svh + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=n_ok[:, None], other=0.0
    )
    col = tl.load(COL + b * scb + hk * sch + offs_n * scn, mask=n_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)

    lo = 0
    if CAUSAL:
        lo = tl.maximum(pid_n * BLOCK_N - shift, 0)
        lo = (lo // BLOCK_M) * BLOCK_M
    s_do = tl.load(SDO + b * ssb + h * ssh)
    for start_m in tl.range(lo, SEQ_Q, BLOCK_M):
        offs_m = start_m + offs_m0
        m_ok = offs_m < SEQ_Q
        q = tl.load(
            Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
            mask=m_ok[:, None],
            other=0.0,
        )
        row = tl.load(ROW + b * srb + h * srh + offs_m * srm, mask=m_ok, other=0.0)
        stat = tl.load(STAT + b * stb + h * sth + offs_m * stm, mask=m_ok, other=float("-inf"))
        delta = tl.load(DELTA + b * stb + h * sth + offs_m * stm, mask=m_ok, other=0.0)
        do = tl.load(
            DO + b * sdob + h * sdoh + offs_m[:, None] * sdom + offs_d[None, :] * sdod,
            mask=m_ok[:, None],
            other=0.0,
        )
        # scores transposed: [BLOCK_N, BLOCK_M]
        st = (
            tl.dot(k, tl.trans(q), max_num_imprecise_acc=IMPRECISE)
            * col[:, None]
            * (row * qk_scale_log2)[None, :]
        )
        valid = n_ok[:, None] & m_ok[None, :]
        if CAUSAL:
            valid = valid & (offs_n[:, None] <= offs_m[None, :] + shift)
        st = tl.where(valid, st, float("-inf"))
        pt = tl.math.exp2(st + stat[None, :])  # 2^LIFT * P^T, in [0, 2^LIFT]
        if PV_FP8:
            dv += tl.dot(pt.to(tl.float8e4nv), do)
            dpt = tl.dot(v, tl.trans(do)) * s_do
        else:
            dv += tl.dot(pt.to(tl.bfloat16), do)
            dpt = tl.dot(v, tl.trans(do))
        dst = pt * (1.0 / (1 << LIFT)) * (dpt - delta[None, :])
        dst = tl.where(valid, dst, 0.0)
        if QK_FP8:  # per-token scales in the BF16 operand, one BF16 dS (reference_backward's fp8)
            dk += tl.dot(dst.to(tl.bfloat16), (q.to(tl.float32) * row[:, None]).to(tl.bfloat16))
        else:
            dk += tl.dot((dst * row[None, :]).to(tl.bfloat16), q)
    dk = dk * sm_scale
    # epilogue of dV: dO's per-head scale, the 1/2^LIFT factor (separate from the lift of P) and V's
    # channel scale, which was folded into dO before its E5M2 quantization
    vs = tl.load(VSCALE + b * svsb + hk * svsh + offs_d * svsd)
    dv = dv * s_do * (1.0 / (1 << LIFT)) / vs[None, :]
    tl.store(
        DK + b * sdkb + h * sdkh + offs_n[:, None] * sdkn + offs_d[None, :] * sdkd,
        dk.to(DK.dtype.element_ty),
        mask=n_ok[:, None],
    )
    tl.store(
        DV + b * sdkb + h * sdkh + offs_n[:, None] * sdkn + offs_d[None, :] * sdkd,
        dv.to(DV.dtype.element_ty),
        mask=n_ok[:, None],
    )


@triton.jit
def _bwd_dq_kernel(
    Q,
    K,
    V,
    ROW,
    COL,
    DO,
    STAT,
    DELTA,
    SDO,
    DQ,
    sqb,
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    srb,
    srh,
    srm,
    scb,
    sch,
    scn,
    sdob,
    sdoh,
    sdom,
    sdod,
    stb,
    sth,
    stm,
    ssb,
    ssh,
    sdqb,
    sdqh,
    sdqm,
    sdqd,
    H_Q,
    GROUP,
    SEQ_Q,
    SEQ_K,
    qk_scale_log2,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    QK_FP8: tl.constexpr,
    PV_FP8: tl.constexpr,
    LIFT: tl.constexpr,
    IMPRECISE: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H_Q
    h = pid_bh % H_Q
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n0 = tl.arange(0, BLOCK_N)
    m_ok = offs_m < SEQ_Q
    shift = SEQ_K - SEQ_Q

    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd, mask=m_ok[:, None], other=0.0
    )
    row = tl.load(ROW + b * srb + h * srh + offs_m * srm, mask=m_ok, other=0.0)
    stat = tl.load(STAT + b * stb + h * sth + offs_m * stm, mask=m_ok, other=float("-inf"))
    delta = tl.load(DELTA + b * stb + h * sth + offs_m * stm, mask=m_ok, other=0.0)
    do = tl.load(
        DO + b * sdob + h * sdoh + offs_m[:, None] * sdom + offs_d[None, :] * sdod,
        mask=m_ok[:, None],
        other=0.0,
    )
    s_do = tl.load(SDO + b * ssb + h * ssh)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = SEQ_K
    if CAUSAL:
        hi = tl.maximum(tl.minimum(SEQ_K, (pid_m + 1) * BLOCK_M + shift), 0)
    for start_n in tl.range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < SEQ_K
        kt = tl.load(
            K + b * skb + hk * skh + offs_n[None, :] * skn + offs_d[:, None] * skd,
            mask=n_ok[None, :],
            other=0.0,
        )
        vt = tl.load(
            V + b * svb + hk * svh + offs_n[None, :] * svn + offs_d[:, None] * svd,
            mask=n_ok[None, :],
            other=0.0,
        )
        col = tl.load(COL + b * scb + hk * sch + offs_n * scn, mask=n_ok, other=0.0)
        s = tl.dot(q, kt, max_num_imprecise_acc=IMPRECISE) * (row * qk_scale_log2)[:, None] * col[None, :]
        valid = n_ok[None, :] & m_ok[:, None]
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None] + shift)
        s = tl.where(valid, s, float("-inf"))
        p = tl.math.exp2(s + stat[:, None])
        if PV_FP8:
            dp = tl.dot(do, vt) * s_do
        else:
            dp = tl.dot(do, vt)
        ds = p * (1.0 / (1 << LIFT)) * (dp - delta[:, None])
        ds = tl.where(valid, ds, 0.0)
        if QK_FP8:  # per-token scales in the BF16 operand, one BF16 dS (reference_backward's fp8)
            dq += tl.dot(ds.to(tl.bfloat16), tl.trans((kt.to(tl.float32) * col[None, :]).to(tl.bfloat16)))
        else:
            dq += tl.dot((ds * col[None, :]).to(tl.bfloat16), tl.trans(kt))
    dq = dq * sm_scale
    tl.store(
        DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqm + offs_d[None, :] * sdqd,
        dq.to(DQ.dtype.element_ty),
        mask=m_ok[:, None],
    )
