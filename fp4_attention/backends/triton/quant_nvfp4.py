"""Triton NVFP4 quantizers (E2M1 values, E4M3 scales per 16 elements, an FP32 global scale) and the BF16
decode ``s_b * q`` that the Hopper emulation of the NVFP4 QK product multiplies.

* :func:`quantize_nvfp4_rows`: the global scale given per row (the per-head scale broadcast over its
  rows); also returns ``s_b * q`` decoded to BF16, which is exact.
* :func:`quantize_nvfp4_heads`: the per-head global scale from an amax pass first
  (``quant_common._head_amax_kernel``), then the same rows kernel.
* :func:`decode_nvfp4_rows`: the BF16 ``s_b * q`` of a saved NVFP4 tensor.

The rows kernel rounds to E2M1 with magic addends (:func:`_e2m1_round`) and divides by each block's
denominator through one reciprocal per block and ``div_rn``'s own three-FFMA fast path
(:func:`_block_quotients`): 0.277 -> 0.179 ms for Q at B4 H32 S4096 D128 with its amax pass
(``results/quant_fast_div_h200``); then per-block masks instead of per-element selects, a 3-D grid,
and the fast division decided from the per-head scale: 0.177 -> 0.151 ms by kernel time, 0.69 of
the copy's bandwidth (``results/quant_amax_h200``). Bytes equal ``numerics.quant``'s
(``quant_common``). With ``signs`` (a Q/K rotation) rows are rotated as they are loaded; the global
scale of the rotated tensor comes from ``rotation.rotated_row_amax``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...numerics.quant import NVFP4Tensor
from .launch import cdiv, interpreted, launcher
from .quant_common import (
    _blocks_option,
    _check_grid_axis,
    _head_amax_kernel,
    _max_propagating_nan,
    _rotation_args,
    _row_input,
    _rows_option,
    amax_and_flag_words,
    check_int32_span,
    e4m3_to_bf16,
)
from .rotation import rotate_rows

__all__ = [
    "decode_nvfp4_rows",
    "nvfp4_block_rows",
    "nvfp4_head_outputs",
    "nvfp4_to_bf16",
    "quantize_nvfp4_heads",
    "quantize_nvfp4_rows",
]


@triton.jit
def _e2m1_code(a):
    """|value| -> E2M1 magnitude code 0..7, round-to-nearest-even, saturating (a >= 0)."""
    c = (
        (a > 0.25).to(tl.int32)
        + (a >= 0.75).to(tl.int32)
        + (a > 1.25).to(tl.int32)
        + (a >= 1.75).to(tl.int32)
    )
    c += (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32)
    return c


@triton.jit
def _e2m1_value(c):
    """E2M1 magnitude code 0..7 -> value (exact): the FP32 bits built from the code's exponent and
    mantissa (0.5 for the subnormal code 1, zero for code 0), no exp2."""
    c = c.to(tl.int32)
    e = c >> 1
    bits = tl.where(e == 0, 126 << 23, ((e + 126) << 23) | ((c & 1) << 22))
    return tl.where(c == 0, 0.0, bits.to(tl.float32, bitcast=True))


# Magic addends of :func:`_e2m1_round`: 1.5 * 2^k, whose binade's ulp is 2^(k - 23): 0.5, 1, 2
E2M1_RN_HALF = tl.constexpr(6291456.0)  # 1.5 * 2^22
E2M1_RN_ONE = tl.constexpr(12582912.0)  # 1.5 * 2^23
E2M1_RN_TWO = tl.constexpr(25165824.0)  # 1.5 * 2^24


@triton.jit
def _e2m1_round(a):
    """|value| ``a`` (FP32, 0 <= a <= 6, not NaN) -> (E2M1 magnitude code 0..7, its value), round to
    nearest, ties to even: the codes of :func:`_e2m1_code` and the values of :func:`_e2m1_value`.

    E2M1's grid has the step 0.5 on [0, 2], 1 on [2, 4] and 2 on [4, 6]. Adding ``M = 1.5 * 2^k``
    with the binade's step as the sum's ulp rounds ``a`` once to a multiple of the step (the FP32
    adder's round-to-nearest-even; an even multiple is an even E2M1 code, so the ties agree), ``s -
    M`` is the value (exact) and the low bits of ``s`` count the steps: the code is that count plus
    0, 2 or 4. Four FP32 operations and a few integer ones instead of seven comparisons and the
    decode (``tests/backends/test_triton_quant.py`` checks every FP32 value in [0, 6] on the GPU).
    """
    # M from the exponent of max(a, 1) (E = 0, 1, 2 on [0, 2), [2, 4), [4, 6]): 1.5 * 2^(22 + E), by
    # integer operations on the bits (a >= 0, so they order as the values do), three instead of two
    # comparisons and two selects
    e = tl.maximum(a.to(tl.int32, bitcast=True), 0x3F800000) & 0x7F800000
    m_bits = e + ((22 << 23) | 0x400000)
    m = m_bits.to(tl.float32, bitcast=True)
    s = a + m
    steps = s.to(tl.int32, bitcast=True) & 7
    # M's exponent and leading mantissa bit (bits >> 22: 299, 301, 303) give the offset of its
    # binade's first code (0, 2, 4)
    code = steps + ((m_bits >> 22) - 299)
    return code, s - m


# the range in which the NVFP4 quantizer divides through div_rn's own fast path (_fast_reciprocal,
# _div_by_reciprocal) without its range check. (The dO quantizer's division by its per-head scale
# was tried the same way: 0.250 -> 0.277 ms at B4 H32 S4096, slower; results/quant_fast_div_h200)
DIV_FAST_MIN = tl.constexpr(2.0**-64)
DIV_FAST_MAX = tl.constexpr(2.0**60)  # the GPU test's denominators reach just under 2^61
DIV_FAST_QUOTIENT_MAX = tl.constexpr(2.0**32)


@triton.jit
def _fast_reciprocal(d):
    """``div_rn``'s reciprocal of FP32 ``d``: MUFU.RCP, then one Newton step (two FFMA), the first
    three instructions of the sequence ptxas emits for ``div.rn.f32``, so that it can be formed once
    per divisor instead of once per quotient. Inline PTX: not available under ``TRITON_INTERPRET``."""
    rcp = tl.inline_asm_elementwise(
        "rcp.approx.ftz.f32 $0, $1;", "=f,f", [d], dtype=tl.float32, is_pure=True, pack=1
    )
    return tl.fma(rcp, tl.fma(-d, rcp, 1.0), rcp)


@triton.jit
def _div_by_reciprocal(x, d, y):
    """``x / d`` from ``y = _fast_reciprocal(d)``: ``div_rn``'s fast path, the same three FFMA in
    the same order (``q0 = x y``, ``q = q0 + (x - d q0) y``), without its range check (FCHK) and
    slow path. Equal to ``div_rn(x, d)`` bit for bit wherever FCHK passes, a range check of the
    exponents; the callers keep ``2^-64 <= d <= 2^60`` and ``|x / d| <= 2^32``, where it can only
    fire for an ``|x / d|`` below 2^-38 (the result is then tiny as well, but its sign may be lost:
    callers take the sign from ``x``). ``tests/backends/test_triton_quant.py`` checks the bits
    against ``div_rn`` over every BF16 ``x`` and a sweep of ``d``."""
    q0 = tl.fma(x, y, 0.0)
    return tl.fma(y, tl.fma(-d, q0, x), q0)


@triton.jit
def _block_quotients(x, d, okd, fast):
    """``x [R, NB, 16] / d [R, NB]`` (FP32) rounded to nearest, as ``div_rn`` rounds it wherever the
    E2M1 code can depend on it.

    ``div_rn`` compiles to a reciprocal (MUFU.RCP), one Newton step, a quotient with one residual
    correction (five FFMA), a range check (FCHK) and a branch to a slow path, all per element.
    ``fast`` (a scalar): the reciprocal once per block (:func:`_fast_reciprocal`), then per element
    the three FFMA of :func:`_div_by_reciprocal`; the caller sets it only when every block with a
    denominator has ``2^-64 <= d <= 2^60`` and a quotient bound ``amax_b / d <= 2^32``, else
    ``div_rn`` for all. Inside that range an ``|x / d|`` below 2^-38 is the only place the two
    may differ, far below E2M1's first rounding boundary (0.25): code 0 either way (the caller
    takes the sign from ``x``, not from the quotient). Quotients of blocks without a denominator
    (``okd`` false) are 0 for every finite ``x``.
    """
    if fast:
        # a block without a denominator gets the reciprocal 0: its quotients are 0 for every finite
        # x without a select per element (a non-finite x is only in a poisoned block)
        y = tl.where(okd, _fast_reciprocal(d), 0.0)
        q = _div_by_reciprocal(x, d[:, :, None], y[:, :, None])
    else:
        q = tl.where(okd[:, :, None], tl.math.div_rn(x, tl.broadcast_to(d[:, :, None], x.shape)), 0.0)
    return q


@triton.jit
def _nvfp4_rows_kernel(
    X,
    G,
    P,
    SC,
    DEC,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    D: tl.constexpr,
    ROWS: tl.constexpr,
    SIGNS=None,
    ROTATE: tl.constexpr = False,
    LOG2_D: tl.constexpr = 0,
    INV_SQRT_D: tl.constexpr = 1.0,
    HEAD_AMAX: tl.constexpr = False,
    BADH=None,
    GOUT=None,
    TOK=None,
    FAST_DIV: tl.constexpr = True,  # False under TRITON_INTERPRET (no inline PTX there)
    BLOCKS: tl.constexpr = 1,
):
    """NVFP4 rows of ``X [B, H, SEQ, D]`` (strides ``sxb, sxh, sxs``, unit last), grid
    ``(cdiv(SEQ, ROWS * BLOCKS), H, B)``: each program quantizes BLOCKS blocks of ROWS rows of one
    head, one after the other, the next block's rows loaded before the current one is quantized. G:
    the global scale per row (FP32 [B * H * SEQ]); with HEAD_AMAX, G is instead the per-(batch,
    head) amax of |x| (FP32 [B * H], ``_head_amax_kernel``) and BADH its non-finite flag: the global
    scale amax / 2688 (1 for an all-zero head, NaN for a non-finite one: ``quant.amax_scale``) is
    formed here and written to GOUT [B * H], and per row to TOK [B * H * SEQ] (the per-token vectors
    the attention kernels read)."""
    # a 3-D grid, (blocks of ROWS rows, H, B): the row offsets need no integer division (a division
    # of the program's (batch, head) index took about 25 instructions per thread)
    hi, bi = tl.program_id(1), tl.program_id(2)
    bh = bi * H + hi
    if HEAD_AMAX:  # one head per program: its global scale is a scalar
        amax = tl.load(G + bh)
        g1 = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, 2688.0))
        g1 = tl.where(tl.load(BADH + bh) != 0, float("nan"), g1)
        if tl.program_id(0) == 0:
            tl.store(GOUT + bh, g1)
    else:
        g1 = 1.0  # unused: the fast division is decided per block
    s = tl.program_id(0) * (ROWS * BLOCKS) + tl.arange(0, ROWS)
    head = bi * sxb + hi * sxh  # the head's first element in X (any strides)
    x = _nvfp4_rows_x(X, head, s, SEQ, sxs, D, ROWS, SIGNS, ROTATE, LOG2_D, INV_SQRT_D)
    for i in tl.static_range(BLOCKS):
        if i + 1 < BLOCKS:  # the next block's loads in flight while this one is quantized
            x_next = _nvfp4_rows_x(X, head, s + ROWS, SEQ, sxs, D, ROWS, SIGNS, ROTATE, LOG2_D, INV_SQRT_D)
        ok = s < SEQ
        r = bh * SEQ + s  # row (b, h, s) of the contiguous output
        if HEAD_AMAX:
            g = tl.full([ROWS], 1.0, tl.float32) * g1
            tl.store(TOK + r, g, mask=ok)
        else:
            g = tl.load(G + r, mask=ok, other=1.0)
        nvfp4_block_rows(x, g, g1, r, ok, P, SC, DEC, 0, ROWS, D // 16, D, HEAD_AMAX, FAST_DIV)
        if i + 1 < BLOCKS:
            x = x_next
            s = s + ROWS


@triton.jit
def _nvfp4_rows_x(
    X,
    base,
    s,
    SEQ,
    sxs,
    D: tl.constexpr,
    ROWS: tl.constexpr,
    SIGNS,
    ROTATE: tl.constexpr,
    LOG2_D: tl.constexpr,
    INV_SQRT_D: tl.constexpr,
):
    """Rows ``s`` (positions, ``ROWS``) of one head of X (element offset ``base``, row stride ``sxs``,
    unit last) as FP32 ``[ROWS, D // 16, 16]``, 0 past SEQ; ``ROTATE``: times H in registers, before
    the block scales are formed (``rotation.rotate_rows``)."""
    NB: tl.constexpr = D // 16
    ok = s < SEQ
    src = base + s * sxs
    if ROTATE:
        d = tl.arange(0, D)
        xr = tl.load(X + src[:, None] + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        x = tl.reshape(rotate_rows(xr, SIGNS, ROWS, D, LOG2_D, INV_SQRT_D), [ROWS, NB, 16])
    else:
        offs = tl.arange(0, NB)[:, None] * 16 + tl.arange(0, 16)[None, :]  # [NB, 16]
        x = tl.load(X + src[:, None, None] + offs[None, :, :], mask=ok[:, None, None], other=0.0).to(
            tl.float32
        )
    return x


@triton.jit
def nvfp4_block_rows(
    x,
    g,
    g1,
    r,
    ok,
    P,
    SC,
    DEC,
    C0: tl.constexpr,
    ROWS: tl.constexpr,
    NBX: tl.constexpr,
    D: tl.constexpr,
    HEAD_AMAX: tl.constexpr,
    FAST_DIV: tl.constexpr,
):
    """NVFP4 of the 16-element blocks ``x [ROWS, NBX, 16]`` (FP32) of rows ``r`` (``ok``: the rows to
    write), columns ``C0 .. C0 + 16 NBX`` of rows of ``D``, with the per-row global scale ``g
    [ROWS]`` (``HEAD_AMAX``: one scale ``g1`` for them all, which decides the fast division): block
    scales to SC ``[*, D / 16]``, packed E2M1 codes to P ``[*, D / 2]``, the exact decode ``s_b * q``
    to DEC ``[*, D]`` (BF16). The body of ``_nvfp4_rows_kernel`` (whole rows, C0 = 0) and of the
    RoPE'd rows kernel (``rope.py``: each half row)."""
    NB: tl.constexpr = D // 16
    # one NaN-propagating max per element (the rows kernel's reason): the block's amax, NaN or Inf
    # for a block holding one; such a block's amax counts as 0, so its denominator is 0 and its
    # quotients 0 (the reference zeroes the block's x first: the same codes)
    m_b = tl.reduce(tl.abs(x), 2, _max_propagating_nan)  # [ROWS, NBX]
    bad = (m_b != m_b) | (m_b == float("inf")) | ((g != g) | (tl.abs(g) == float("inf")))[:, None]
    amax_b = tl.where(bad, 0.0, m_b)
    six = tl.full([ROWS, NBX], 6.0, tl.float32)
    gb = tl.broadcast_to(g[:, None], [ROWS, NBX])
    s_real = tl.math.div_rn(tl.math.div_rn(amax_b, six), gb)
    s_code = tl.minimum(s_real, 448.0).to(tl.float8e4nv)
    s_b = s_code.to(tl.float32)
    s_bits = s_code.to(tl.uint8, bitcast=True)
    s_bits = tl.where(bad, 0x7F, s_bits)
    denom = s_b * gb
    okd = (denom > 0.0) & (denom == denom) & (denom != float("inf"))
    safe = tl.where(okd, denom, 1.0)
    if HEAD_AMAX:
        # one global scale for the program, formed from its head's amax: every block's s_b is 0
        # (no denominator) or in [2^-9, 448] (amax_b / 6 / g <= 448, the E4M3 range), and its
        # quotients are at most about 12 (s_b at least half of amax_b / 6 / g once it is not 0), so
        # a g in [2^-55, 2^51] puts every denominator in the fast division's range: a test of one
        # scalar instead of a reduction over the program's blocks
        fast = (g1 >= DIV_FAST_MIN * 512.0) & (g1 <= DIV_FAST_MAX / 512.0)
    else:
        ok_range = (safe >= DIV_FAST_MIN) & (safe <= DIV_FAST_MAX) & (amax_b <= safe * DIV_FAST_QUOTIENT_MAX)
        fast = tl.min(((~okd) | ok_range).to(tl.int32)) == 1  # every block of the program
    if FAST_DIV:
        qv = _block_quotients(x, safe, okd, fast)
    else:  # under TRITON_INTERPRET (no inline PTX)
        qv = _block_quotients(x, safe, okd, False)
    code, val = _e2m1_round(tl.minimum(tl.abs(qv), 6.0))
    # the sign is x's where the block has a denominator (denom > 0: the reference's signbit of
    # x / denom, -0.0 included) and + where the quotients are set to 0: masked per block, not
    # selected per element; a poisoned block's magnitudes (from a NaN or Inf x) are masked to 0
    sign = x.to(tl.int32, bitcast=True) & tl.where(okd, -2147483648, 0)[:, :, None]
    code = (code & tl.where(bad, 0, 7)[:, :, None]) | ((sign >> 28) & 8)
    # x's sign applied as a factor of +-1 (XOR: a negative global scale gives a negative s_b); a
    # poisoned block decodes through a NaN scale (its sign is +), not a select per element
    s_dec = tl.where(bad, float("nan"), s_b)
    dec = ((val * s_dec[:, :, None]).to(tl.int32, bitcast=True) ^ sign).to(tl.float32, bitcast=True)
    code2 = tl.reshape(code, [ROWS, NBX * 8, 2])
    lo, hi = tl.split(code2)
    packed = (lo | (hi << 4)).to(tl.uint8)
    offs = tl.arange(0, NBX)[:, None] * 16 + tl.arange(0, 16)[None, :]  # [NBX, 16]
    tl.store(P + r[:, None] * (D // 2) + (C0 // 2 + tl.arange(0, NBX * 8))[None, :], packed, mask=ok[:, None])
    tl.store(
        SC + r[:, None] * NB + (C0 // 16 + tl.arange(0, NBX))[None, :], s_bits.to(tl.uint8), mask=ok[:, None]
    )
    tl.store(DEC + r[:, None, None] * D + C0 + offs[None, :, :], dec.to(tl.bfloat16), mask=ok[:, None, None])


def nvfp4_head_outputs(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The outputs of the NVFP4 quantizer with per-head global scale for ``x [B, H, S, D]``, empty:
    ``(global scale [B, H, 1, 1] FP32, payload [B, H, S, D/2] uint8, block scales [B, H, S, D/16]
    uint8, decode [B, H, S, D] BF16, per-token scale [B, H, S] FP32)``, contiguous."""
    b, h, s, d = x.shape
    g = torch.empty((b, h, 1, 1), dtype=torch.float32, device=x.device)
    payload = torch.empty((b, h, s, d // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((b, h, s, d // 16), dtype=torch.uint8, device=x.device)
    dec = torch.empty((b, h, s, d), dtype=torch.bfloat16, device=x.device)
    tok = torch.empty((b, h, s), dtype=torch.float32, device=x.device)
    return g, payload, scales, dec, tok


def quantize_nvfp4_heads(
    x: torch.Tensor,
    *,
    rows: int | None = None,
    num_warps: int = 4,
    blocks: int = 2,
    zeroed: torch.Tensor | None = None,
) -> tuple[NVFP4Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 of BF16 ``x [B, H, S, D]`` (any strides with a unit last one: read in place) with its
    per-(batch, head) global scale, the Q/K quantization of ``nvfp4qk_fp8pv``, in two kernels (a
    per-head amax pass, then the rows, which form the global scale themselves) and one fill.
    ``rows`` / ``num_warps``: the rows kernel's launch options (rows per block, a power of two,
    default 2048 / D; warps), for ``bench/quant_bench.py``; the bytes do not depend on them.
    ``blocks``: blocks of ``rows`` rows per program of the rows kernel (1, 2 or 4; a program
    quantizes ``rows * blocks`` rows), each block's loads issued before the previous block is
    quantized, a launch option likewise. Default 2: at Q B4 H32 S4096 D128 the quantizer's kernels
    took 0.1714-0.1722 ms against 0.1800-0.1811 at 1 block, on an H100 in three runs; 4 blocks, 8
    warps, and register caps of 56, 64 and 80 lost (``results/quant_blocks_h100``).
    ``zeroed``: the amax pass's words, ``2 * B * H`` zeroed FP32 (:func:`amax_and_flag_words`; the
    caller's fill then covers them), default a fill of its own.

    Returns:
        ``(NVFP4Tensor, decoded, token_scale)``: bytes and global scale equal ``quant.quantize_nvfp4(x,
        quant.nvfp4_global_scale(x, dims=(2, 3)))`` (global scale ``[B, H, 1, 1]``: amax / 2688, 1
        for an all-zero head, NaN for a head holding a NaN or Inf); ``decoded`` is ``s_b * q`` in
        BF16 (exact), NaN for a poisoned block; ``token_scale`` FP32 ``[B, H, S]`` the global scale
        of each token's head (the row/col vector of the attention kernels, written by the same
        kernel: no broadcast copy); all contiguous.
    Raises:
        ValueError: not 4-D, as ``_row_input``, D not a power of two in [16, 256], S = 0, B * H
            above 65,535 (raised before any launch), ``rows`` not a power of two, ``blocks`` not 1,
            2 or 4, or ``zeroed`` not as described.
    """
    if x.dim() != 4:
        raise ValueError(f"quantize_nvfp4_heads: needs [B, H, S, D], got shape {tuple(x.shape)}")
    x, _ = _row_input(x, "quantize_nvfp4_heads")
    b, h, s, d = x.shape
    if d % 16 or d & (d - 1) or d > 256:
        raise ValueError(f"quantize_nvfp4_heads: last dim must be a power of two in [16, 256], got {d}")
    if s == 0:
        raise ValueError("quantize_nvfp4_heads: no tokens (S = 0); the per-head global scale is undefined")
    layout = (h, s, *x.stride()[:3])  # the true heads, also for a contiguous x
    _check_grid_axis("quantize_nvfp4_heads", b * h, "B * H (the amax pass's grid)")
    amax, bad = amax_and_flag_words(zeroed, (b * h,), x.device, "quantize_nvfp4_heads")
    block_s = 64
    launcher(_head_amax_kernel)[(cdiv(s, block_s), b * h)](x, amax, bad, *layout, D=d, BLOCK_S=block_s)
    g, payload, scales, dec, tok = nvfp4_head_outputs(x)
    # 2048 // d rows x 4 warps: 0.1792 ms at B4 H32 S4096 D128 on the H200 against 0.2073 for 8 rows,
    # 0.1860 for 32 (results/quant_fast_div_h200/quant_bench_call2_new_2fac340.md; D 128 only)
    rows = _rows_option("quantize_nvfp4_heads", rows, max(1, 2048 // d))
    blocks = _blocks_option("quantize_nvfp4_heads", blocks)
    launcher(_nvfp4_rows_kernel)[(cdiv(s, rows * blocks), h, b)](
        x,
        amax,
        payload,
        scales,
        dec,
        *layout,
        D=d,
        ROWS=rows,
        num_warps=num_warps,
        HEAD_AMAX=True,
        BADH=bad,
        GOUT=g,
        TOK=tok,
        FAST_DIV=not interpreted(),
        BLOCKS=blocks,
    )
    return NVFP4Tensor(payload=payload, block_scale=scales, global_scale=g), dec, tok


def quantize_nvfp4_rows(
    x: torch.Tensor, global_scale: torch.Tensor, *, signs: torch.Tensor | None = None
) -> tuple[NVFP4Tensor, torch.Tensor]:
    """NVFP4 of a CUDA ``x [..., D]`` with ``global_scale`` broadcastable to ``x[..., :1]``; ``x``
    contiguous, or ``[B, H, S, D]`` in any strides (read in place: ``_row_input``).

    ``signs``: FP32 ``[D]`` signs of a Q/K rotation: quantize ``x H``, rotated in the kernel (the
    global scale must then be the rotated tensor's: ``rotation.rotated_row_amax``).

    Returns:
        ``(NVFP4Tensor, decoded)``: bytes equal ``quant.quantize_nvfp4(x, global_scale)`` (of
        ``rotation.rotate(x, signs)`` with ``signs``); ``decoded`` is ``s_b * q`` in BF16 (exact),
        NaN for a poisoned block; all contiguous.
    Raises:
        ValueError: as ``_row_input``, D not a power of two in [16, 256], or a strided 4-D ``x``
            with B or H above 65,535.
    """
    x, layout = _row_input(x, "quantize_nvfp4_rows")
    d = x.shape[-1]
    if d % 16 or d & (d - 1) or d > 256:
        raise ValueError(f"quantize_nvfp4_rows: last dim must be a power of two in [16, 256], got {d}")
    g = global_scale.float().expand(*x.shape[:-1], 1).contiguous()
    payload = torch.empty((*x.shape[:-1], d // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((*x.shape[:-1], d // 16), dtype=torch.uint8, device=x.device)
    dec = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    rows = max(1, 1024 // d)  # not swept (quant_bench's "nvfp4 rows" row times this launch)
    heads, seq = layout[0], layout[1]
    batch = x.numel() // (d * seq * heads) if seq else 0
    _check_grid_axis("quantize_nvfp4_rows", heads, "H")
    _check_grid_axis("quantize_nvfp4_rows", batch, "B")
    launcher(_nvfp4_rows_kernel)[(cdiv(seq, rows), heads, batch)](
        x,
        g,
        payload,
        scales,
        dec,
        *layout,
        D=d,
        ROWS=rows,
        num_warps=4,
        FAST_DIV=not interpreted(),
        **_rotation_args(x, signs),
    )
    return NVFP4Tensor(payload=payload, block_scale=scales, global_scale=global_scale.float()), dec


@triton.jit
def nvfp4_to_bf16(packed, scales, ROWS: tl.constexpr, D: tl.constexpr):
    """NVFP4 rows -> ``s_b * q`` in BF16, exact (<= 6 significant bits, in range): packed E2M1 codes
    uint8 ``[ROWS, D // 2]`` (low nibble first, ``formats.pack_e2m1``) and E4M3 block-scale codes uint8
    ``[ROWS, D // 16]``; a NaN scale code (0x7F, a poisoned block) gives NaN for its 16 elements, as
    ``NVFP4Tensor.scaled_payload`` does."""
    c = tl.reshape(tl.join(packed & 0xF, packed >> 4), [ROWS, D // 16, 16])
    # the sign by a multiply: Triton's unary minus is 0 - x, which turns code 8 (-0) into +0
    q = _e2m1_value(c & 7) * tl.where((c & 8) != 0, -1.0, 1.0)
    s = e4m3_to_bf16(scales).to(tl.float32)  # exact; NaN for a poisoned block's scale
    return tl.reshape(q * s[:, :, None], [ROWS, D]).to(tl.bfloat16)


@triton.jit
def _nvfp4_decode_kernel(P, SC, OUT, n_rows, D: tl.constexpr, ROWS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = r < n_rows
    packed = tl.load(P + r[:, None] * (D // 2) + tl.arange(0, D // 2)[None, :], mask=ok[:, None], other=0)
    scales = tl.load(SC + r[:, None] * (D // 16) + tl.arange(0, D // 16)[None, :], mask=ok[:, None], other=0)
    y = nvfp4_to_bf16(packed, scales, ROWS, D)
    tl.store(OUT + r[:, None] * D + tl.arange(0, D)[None, :], y, mask=ok[:, None])


def decode_nvfp4_rows(t: NVFP4Tensor) -> torch.Tensor:
    """The BF16 ``s_b * q`` of a saved NVFP4 tensor (payload ``[..., D // 2]``, block scales
    ``[..., D // 16]``, both contiguous on CUDA), the operand of the exact BF16 emulation of the NVFP4
    QK product (contract §1), in one kernel.

    Returns:
        BF16 ``[..., D]`` contiguous, bytes equal ``t.scaled_payload().bfloat16()`` (NaN for a poisoned
        block); the global scale is not applied.
    Raises:
        ValueError: CPU tensors (outside the Triton interpreter), non-contiguous or mis-shaped parts, or
            D not a power of two in [16, 256].
    """
    p, sc = t.payload, t.block_scale
    d = 2 * p.shape[-1]
    if (not p.is_cuda and not interpreted()) or not (p.is_contiguous() and sc.is_contiguous()):
        raise ValueError(
            "decode_nvfp4_rows: needs contiguous CUDA payload and block scales (on a CPU: "
            "NVFP4Tensor.scaled_payload().bfloat16(), or TRITON_INTERPRET=1)"
        )
    if d & (d - 1) or not 16 <= d <= 256 or tuple(sc.shape) != (*p.shape[:-1], d // 16):
        raise ValueError(
            f"decode_nvfp4_rows: payload [..., D / 2] and block scales [..., D / 16] with D a power of two "
            f"in [16, 256]; got {tuple(p.shape)} / {tuple(sc.shape)}"
        )
    out = torch.empty((*p.shape[:-1], d), dtype=torch.bfloat16, device=p.device)
    n = p.numel() * 2 // d
    rows = max(1, 2048 // d)
    check_int32_span("decode_nvfp4_rows", out)
    launcher(_nvfp4_decode_kernel)[(cdiv(n, rows),)](p, sc, out, n, D=d, ROWS=rows, num_warps=4)
    return out
