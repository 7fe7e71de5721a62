"""RoPE in Triton (``numerics/rope.py`` defines it): a standalone kernel, and the per-token FP8 row
quantizer of Q and K with RoPE applied to the rows it loads.

* :func:`rope_rows`: ``apply_rope`` (or, with ``grad=True``, ``rope_grad``) of a ``[B, H, S, D]``
  tensor read in place from any strides with a unit last one, written BF16 in its memory order: the RoPE of
  the backends that quantize without it, the backward's ``R^T dQ`` / ``R^T dK``, and the benchmark's
  RoPE in front of the BF16 baselines; :func:`rope_rows_pair` does two tensors (Q and K, dQ and dK)
  in one launch.
* :func:`quantize_fp8_rows_pair_rope`: the bytes of ``quant.quantize_fp8_rows_pair(apply_rope(q),
  apply_rope(k))`` in one launch that reads Q and K once and writes only their FP8 codes and scales:
  the roped BF16 Q/K never go through memory.
* :func:`quantize_nvfp4_heads_rope`: the bytes of ``quant.quantize_nvfp4_heads(apply_rope(x))``
  (``nvfp4qk_fp8pv``'s Q or K) in its two passes, each applying RoPE to the rows it reads: the
  per-head amax of the RoPE'd rows, then the NVFP4 blocks of each half row
  (``quant.nvfp4_block_rows``, the rows kernel's own body).

Both kernels load a row as its two halves (channels ``i`` and ``i + D/2``, the pairs RoPE rotates),
so no register shuffle is needed, and a program loads the ``cos``/``sin`` rows of its positions once
for ``HEADS`` heads (the tables are FP32 ``[S, D/2]``: read per head, they would cost twice the bytes
of the BF16 rows, from L2). Both are compiled with FP contraction off (``enable_fp_fusion=False``):
each product is rounded to FP32 before the sum, as in the reference, so the bits match it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...numerics.quant import FP8_FORMATS, FP8Tensor, NVFP4Tensor
from ..layouts import empty_in_layout_of
from .launch import cdiv, interpreted, launcher
from .quant_common import _max_propagating_nan, _rows_option, amax_and_flag_words, check_int32_span
from .quant_fp8 import _fp8_codes, _fp8_scale
from .quant_nvfp4 import nvfp4_block_rows, nvfp4_head_outputs

__all__ = ["quantize_fp8_rows_pair_rope", "quantize_nvfp4_heads_rope", "rope_rows", "rope_rows_pair"]

# positions per program and heads per program (the tables loaded once for HEADS heads). Heads per
# program by kernel, from one H200 run (2026-12-05, results/session_2026-12-05_h200/quant_bench_h200.md,
# Q B4 H32 + K B4 H8 S4096 D128, 16 positions): the fused FP8 pair 0.1169 ms at 4 heads, 0.1076 at 2,
# 0.1113 at 1, 0.1099 at 8; the NVFP4 quantizer 0.2051 at 4, 0.1910 at 1, 0.2142 at 2. rope_rows
# (RoPE alone) was timed at 4 only.
DEFAULT_ROWS = 16
DEFAULT_HEADS = 4
PAIR_HEADS = 2
NVFP4_HEADS = 1


@triton.jit
def _rope_halves(x1, x2, c, s, GRAD: tl.constexpr):
    """The rotated halves ``(y1, y2)`` in FP32 (``numerics.rope``'s products and sums; ``GRAD``: the
    transposed rotation of ``rope_grad``)."""
    if GRAD:
        return x1 * c + x2 * s, x2 * c - x1 * s
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def _round_bf16(y, BY_BITS: tl.constexpr):
    """FP32 ``y`` rounded to the nearest BF16, ties to even, as an FP32 value (exact in BF16). On the
    GPU the hardware conversion (``cvt.rn.bf16.f32``); ``BY_BITS`` (the interpreter, whose conversion
    rounds toward zero) adds half an ulp and the tie bit to the bits: the same values, NaN kept."""
    if BY_BITS:
        u = y.to(tl.uint32, bitcast=True)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        return tl.where(y != y, y, r)
    return y.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _program_place(pid, SEQ, H, ROWS: tl.constexpr, HEADS: tl.constexpr):
    """``(s, ok, h0, b)`` of program ``pid``: its positions (a block of ROWS), their mask, its first
    head (a group of HEADS) and its batch index; positions vary fastest, then head groups."""
    n_sb = tl.cdiv(SEQ, ROWS)
    n_hg = tl.cdiv(H, HEADS)
    sb = pid % n_sb
    hg = (pid // n_sb) % n_hg
    b = pid // (n_sb * n_hg)
    s = sb * ROWS + tl.arange(0, ROWS)
    return s, s < SEQ, hg * HEADS, b


@triton.jit
def _load_tables(COS, SIN, s, ok, HALF: tl.constexpr):
    i = tl.arange(0, HALF)
    t = s[:, None] * HALF + i[None, :]
    c = tl.load(COS + t, mask=ok[:, None], other=0.0)
    sn = tl.load(SIN + t, mask=ok[:, None], other=0.0)
    return c, sn


@triton.jit
def _load_halves(X, b, h, s, okh, sxb, sxh, sxs, HALF: tl.constexpr):
    i = tl.arange(0, HALF)
    src = (b * sxb + h * sxh + s * sxs)[:, None] + i[None, :]
    x1 = tl.load(X + src, mask=okh[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(X + src + HALF, mask=okh[:, None], other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _rope_program(
    pid,
    X,
    Y,
    COS,
    SIN,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    syb,
    syh,
    sys,
    D: tl.constexpr,
    ROWS: tl.constexpr,
    HEADS: tl.constexpr,
    GRAD: tl.constexpr,
    BY_BITS: tl.constexpr,
):
    """Program ``pid``'s rows of one tensor: RoPE (``GRAD``: its transpose), rounded to BF16."""
    HALF: tl.constexpr = D // 2
    s, ok, h0, b = _program_place(pid, SEQ, H, ROWS, HEADS)
    c, sn = _load_tables(COS, SIN, s, ok, HALF)
    i = tl.arange(0, HALF)
    for j in tl.static_range(HEADS):
        h = h0 + j
        okh = ok & (h < H)
        x1, x2 = _load_halves(X, b, h, s, okh, sxb, sxh, sxs, HALF)
        y1, y2 = _rope_halves(x1, x2, c, sn, GRAD)
        dst = (b * syb + h * syh + s * sys)[:, None] + i[None, :]
        # exact in BF16 after _round_bf16: the conversion that stores them rounds nothing
        tl.store(Y + dst, _round_bf16(y1, BY_BITS).to(tl.bfloat16), mask=okh[:, None])
        tl.store(Y + dst + HALF, _round_bf16(y2, BY_BITS).to(tl.bfloat16), mask=okh[:, None])


@triton.jit
def _rope_kernel(
    X,
    Y,
    COS,
    SIN,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    syb,
    syh,
    sys,
    X2,
    Y2,
    COS2,
    SIN2,
    H2,
    SEQ2,
    sxb2,
    sxh2,
    sxs2,
    syb2,
    syh2,
    sys2,
    n_programs,
    D: tl.constexpr,
    ROWS: tl.constexpr,
    HEADS: tl.constexpr,
    GRAD: tl.constexpr,
    BY_BITS: tl.constexpr,
):
    """One tensor, or two in one launch: programs ``[0, n_programs)`` the first's, the rest the
    second's (for one tensor the grid has ``n_programs`` programs and the second's arguments repeat the
    first's)."""
    pid = tl.program_id(0)
    if pid < n_programs:
        _rope_program(
            pid, X, Y, COS, SIN, H, SEQ, sxb, sxh, sxs, syb, syh, sys, D, ROWS, HEADS, GRAD, BY_BITS
        )
    else:
        _rope_program(
            pid - n_programs,
            X2,
            Y2,
            COS2,
            SIN2,
            H2,
            SEQ2,
            sxb2,
            sxh2,
            sxs2,
            syb2,
            syh2,
            sys2,
            D,
            ROWS,
            HEADS,
            GRAD,
            BY_BITS,
        )


@triton.jit
def _roped_rows(X, b, h, s, okh, sxb, sxh, sxs, c, sn, HALF: tl.constexpr, BY_BITS: tl.constexpr):
    """The RoPE'd BF16 halves of rows ``s`` of head ``(b, h)``, as FP32 (the unfused path's values)."""
    x1, x2 = _load_halves(X, b, h, s, okh, sxb, sxh, sxs, HALF)
    y1, y2 = _rope_halves(x1, x2, c, sn, False)
    return _round_bf16(y1, BY_BITS), _round_bf16(y2, BY_BITS)


@triton.jit
def _fp8_rope_program(
    pid,
    X,
    Y,
    S,
    COS,
    SIN,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    D: tl.constexpr,
    FMAX: tl.constexpr,
    E5M2: tl.constexpr,
    ROWS: tl.constexpr,
    HEADS: tl.constexpr,
    BY_BITS: tl.constexpr,
):
    """Program ``pid``'s rows of one tensor: RoPE, the BF16 rounding, the row's scale and FP8 codes
    (``quant._fp8_rows_program``'s rule on the roped row)."""
    HALF: tl.constexpr = D // 2
    s, ok, h0, b = _program_place(pid, SEQ, H, ROWS, HEADS)
    c, sn = _load_tables(COS, SIN, s, ok, HALF)
    i = tl.arange(0, HALF)
    for j in tl.static_range(HEADS):
        h = h0 + j
        okh = ok & (h < H)
        y1, y2 = _roped_rows(X, b, h, s, okh, sxb, sxh, sxs, c, sn, HALF, BY_BITS)
        # one NaN-propagating max per element pair, then one reduction over the half row
        amax = tl.reduce(_max_propagating_nan(tl.abs(y1), tl.abs(y2)), 1, _max_propagating_nan)
        scale, bad = _fp8_scale(amax, FMAX)
        row = (b * H + h) * SEQ + s
        dst = row[:, None] * D + i[None, :]
        tl.store(Y + dst, _fp8_codes(y1, scale[:, None], bad[:, None], E5M2), mask=okh[:, None])
        tl.store(Y + dst + HALF, _fp8_codes(y2, scale[:, None], bad[:, None], E5M2), mask=okh[:, None])
        tl.store(S + row, scale, mask=okh)


@triton.jit
def _fp8_rope_pair_kernel(
    X,
    Y,
    S,
    COS,
    SIN,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    X2,
    Y2,
    S2,
    COS2,
    SIN2,
    H2,
    SEQ2,
    sxb2,
    sxh2,
    sxs2,
    n_programs,
    D: tl.constexpr,
    FMAX: tl.constexpr,
    E5M2: tl.constexpr,
    ROWS: tl.constexpr,
    HEADS: tl.constexpr,
    BY_BITS: tl.constexpr,
):
    """Two tensors in one launch: programs ``[0, n_programs)`` the first's, the rest the second's."""
    pid = tl.program_id(0)
    if pid < n_programs:
        _fp8_rope_program(pid, X, Y, S, COS, SIN, H, SEQ, sxb, sxh, sxs, D, FMAX, E5M2, ROWS, HEADS, BY_BITS)
    else:
        _fp8_rope_program(
            pid - n_programs,
            X2,
            Y2,
            S2,
            COS2,
            SIN2,
            H2,
            SEQ2,
            sxb2,
            sxh2,
            sxs2,
            D,
            FMAX,
            E5M2,
            ROWS,
            HEADS,
            BY_BITS,
        )


@triton.jit
def _head_amax_rope_kernel(
    X,
    AMAX,
    BAD,
    COS,
    SIN,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    D: tl.constexpr,
    ROWS: tl.constexpr,
    HEADS: tl.constexpr,
    BY_BITS: tl.constexpr,
):
    """``quant._head_amax_kernel`` of the RoPE'd ``X``: per (batch, head), the non-finite flag and the
    amax of the finite blocks of rows, by atomic max; ROWS positions x HEADS heads per program (the
    tables loaded once), program ``pid`` placed as ``_program_place`` places it."""
    HALF: tl.constexpr = D // 2
    s, ok, h0, b = _program_place(tl.program_id(0), SEQ, H, ROWS, HEADS)
    c, sn = _load_tables(COS, SIN, s, ok, HALF)
    for j in tl.static_range(HEADS):
        h = h0 + j
        y1, y2 = _roped_rows(X, b, h, s, ok & (h < H), sxb, sxh, sxs, c, sn, HALF, BY_BITS)
        a = tl.reduce(_max_propagating_nan(tl.abs(y1), tl.abs(y2)), 1, _max_propagating_nan)
        m = tl.reduce(a, 0, _max_propagating_nan)
        bad = (m != m) | (m == float("inf"))
        tl.atomic_max(BAD + b * H + h, bad.to(tl.int32), mask=h < H)
        tl.atomic_max(AMAX + b * H + h, tl.where(bad, 0.0, m), mask=h < H)


@triton.jit
def _nvfp4_rope_rows_kernel(
    X,
    AMAX,
    BADH,
    P,
    SC,
    DEC,
    GOUT,
    TOK,
    COS,
    SIN,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    D: tl.constexpr,
    ROWS: tl.constexpr,
    HEADS: tl.constexpr,
    FAST_DIV: tl.constexpr,
    BY_BITS: tl.constexpr,
):
    """``quant._nvfp4_rows_kernel`` (``HEAD_AMAX``) of the RoPE'd ``X``: each head's global scale from
    its amax (AMAX, BADH: ``_head_amax_rope_kernel``), written to GOUT ``[B * H]`` and per row to TOK,
    then the blocks of each half row (``nvfp4_block_rows``); ROWS positions x HEADS heads per
    program."""
    HALF: tl.constexpr = D // 2
    NB: tl.constexpr = D // 16
    s, ok, h0, b = _program_place(tl.program_id(0), SEQ, H, ROWS, HEADS)
    c, sn = _load_tables(COS, SIN, s, ok, HALF)
    for j in tl.static_range(HEADS):
        h = h0 + j
        okh = ok & (h < H)
        bh = b * H + h
        amax = tl.load(AMAX + bh, mask=h < H, other=0.0)
        g1 = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, 2688.0))
        g1 = tl.where(tl.load(BADH + bh, mask=h < H, other=0) != 0, float("nan"), g1)
        r = bh * SEQ + s
        g = tl.full([ROWS], 1.0, tl.float32) * g1
        tl.store(GOUT + bh + 0 * s, g, mask=(s == 0) & (h < H))  # by the program of position 0
        tl.store(TOK + r, g, mask=okh)
        y1, y2 = _roped_rows(X, b, h, s, okh, sxb, sxh, sxs, c, sn, HALF, BY_BITS)
        x1 = tl.reshape(y1, [ROWS, NB // 2, 16])
        x2 = tl.reshape(y2, [ROWS, NB // 2, 16])
        nvfp4_block_rows(x1, g, g1, r, okh, P, SC, DEC, 0, ROWS, NB // 2, D, True, FAST_DIV)
        nvfp4_block_rows(x2, g, g1, r, okh, P, SC, DEC, HALF, ROWS, NB // 2, D, True, FAST_DIV)


def _check_input(x: torch.Tensor, who: str) -> torch.Tensor:
    """``x`` as the kernels read it: 4-D ``[B, H, S, D]`` with a unit last stride (copied otherwise),
    D even and a power of two (the halves are loaded as one block each).

    Raises:
        ValueError: not a CUDA tensor (outside the interpreter), not 4-D, D not a power of two in
            [2, 256], or elements spanning 2^31 or more.
    """
    if (not x.is_cuda and not interpreted()) or x.dim() != 4:
        raise ValueError(
            f"{who}: needs a 4-D [B, H, S, D] CUDA tensor, got {x.device} shape {tuple(x.shape)}"
        )
    d = x.shape[-1]
    if d < 2 or d & (d - 1) or d > 256:
        raise ValueError(
            f"{who}: the head dim must be a power of two in [2, 256], got {d}; apply "
            "numerics.rope.apply_rope (torch) for other head dims"
        )
    if x.stride(-1) != 1:
        x = x.contiguous()
    check_int32_span(who, x)
    return x


def _check_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, who: str) -> None:
    want = (x.shape[2], x.shape[3] // 2)
    for name, t in (("cos", cos), ("sin", sin)):
        if (
            tuple(t.shape) != want
            or t.dtype != torch.float32
            or not t.is_contiguous()
            or t.device != x.device
        ):
            raise ValueError(
                f"{who}: {name} must be a contiguous FP32 {list(want)} tensor on {x.device} "
                f"(numerics.rope.rope_tables), got {t.dtype} {tuple(t.shape)} on {t.device}"
            )


def _programs(x: torch.Tensor, rows: int, heads: int) -> int:
    b, h, s, _ = x.shape
    return b * cdiv(h, heads) * cdiv(s, rows)


def rope_rows(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    grad: bool = False,
    rows: int | None = None,
    heads: int | None = None,
) -> torch.Tensor:
    """``numerics.rope.apply_rope(x, cos, sin)`` (``grad=True``: ``rope_grad``) to the bit.

    Args:
        x: CUDA ``[B, H, S, D]`` (BF16 or FP32), any strides with a unit last one (a ``[B, S, H, D]``
            or ``[S, B, H, D]`` tensor seen as ``[B, H, S, D]`` is read in place), D a power of two.
        cos, sin: contiguous FP32 ``[S, D/2]`` (``numerics.rope.rope_tables``).
        rows, heads: positions and heads per program (powers of two / >= 1): launch options, the
            bits do not depend on them.
    Returns:
        BF16 ``[B, H, S, D]`` in the memory order of ``x`` (``layouts.empty_in_layout_of``: a gradient
        handed back to a ``[S, B, H, D]`` caller needs no copy).
    Raises:
        ValueError: as :func:`quantize_fp8_rows_pair_rope`.
    """
    return _rope_launch("rope_rows", [(x, cos, sin)], grad, rows, heads)[0]


def rope_rows_pair(
    x: torch.Tensor,
    x2: torch.Tensor,
    tables: tuple[torch.Tensor, torch.Tensor],
    tables2: tuple[torch.Tensor, torch.Tensor],
    *,
    grad: bool = False,
    rows: int | None = None,
    heads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rope_rows` of two tensors in one launch (Q and K, or the backward's dQ and dK): the
    bits of ``(rope_rows(x, *tables), rope_rows(x2, *tables2))``, one launch instead of two.

    Args:
        x, x2: CUDA ``[B, H, S, D]`` and ``[B, H2, S2, D]`` (one head dim, one device), strides as
            :func:`rope_rows` takes them.
        tables, tables2: ``(cos, sin)`` of each one's positions, contiguous FP32 ``[S, D/2]``.
        grad, rows, heads: as :func:`rope_rows`.
    Returns:
        ``(y, y2)`` BF16, each in its input's memory order.
    Raises:
        ValueError: as :func:`quantize_fp8_rows_pair_rope` (head dims or devices that differ too).
    """
    return tuple(_rope_launch("rope_rows_pair", [(x, *tables), (x2, *tables2)], grad, rows, heads))


def _rope_launch(who: str, items: list, grad: bool, rows: int | None, heads: int | None) -> list:
    """Checks ``items`` (``(x, cos, sin)``, one or two) and launches ``_rope_kernel`` over all of
    them; returns the outputs."""
    xs = [_check_input(x, who) for x, _, _ in items]
    if len({(x.shape[-1], x.device) for x in xs}) > 1:
        raise ValueError(
            f"{who}: the tensors need one head dim and one device, got "
            + ", ".join(f"{x.shape[-1]} on {x.device}" for x in xs)
        )
    for x, (_, cos, sin) in zip(xs, items):
        _check_tables(x, cos, sin, who)
    rows = _rows_option(who, rows, DEFAULT_ROWS)
    heads = _heads_option(heads)
    ys = [empty_in_layout_of(x, x.shape) for x in xs]
    operands = []
    for x, y, (_, cos, sin) in zip(xs, ys, items):
        operands.append([x, y, cos, sin, x.shape[1], x.shape[2], *x.stride()[:3], *y.stride()[:3]])
    n_first = _programs(xs[0], rows, heads)
    total = sum(_programs(x, rows, heads) for x in xs)
    if total:
        launcher(_rope_kernel)[(total,)](
            *operands[0],
            *operands[-1],  # one tensor: its own arguments again, never reached (n_first == total)
            n_first,
            D=xs[0].shape[-1],
            ROWS=rows,
            HEADS=heads,
            GRAD=grad,
            BY_BITS=interpreted(),
            num_warps=4,
            enable_fp_fusion=False,
        )
    return ys


def quantize_nvfp4_heads_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    rows: int | None = None,
    heads: int | None = None,
    num_warps: int = 4,
    zeroed: torch.Tensor | None = None,
) -> tuple[NVFP4Tensor, torch.Tensor, torch.Tensor]:
    """``quant.quantize_nvfp4_heads(apply_rope(x, cos, sin))`` to the byte, RoPE applied in both of its
    passes (module docstring).

    Args:
        x: CUDA ``[B, H, S, D]`` (BF16 or FP32), any strides with a unit last one (read in place), D a
            power of two in [32, 256].
        cos, sin: contiguous FP32 ``[S, D/2]`` (``numerics.rope.rope_tables``).
        rows, heads, num_warps: the rows pass's positions per program (a power of two, default
            2048 / D), heads per program (default :data:`NVFP4_HEADS`, 1) and warps: launch options,
            the bytes do not depend on them.
        zeroed: as :func:`quant.quantize_nvfp4_heads`'s.
    Returns:
        ``(NVFP4Tensor, decoded, token_scale)`` as :func:`quant.quantize_nvfp4_heads` returns them.
    Raises:
        ValueError: as :func:`quantize_fp8_rows_pair_rope`, D below 32, S = 0, or a bad ``zeroed``.
    """
    who = "quantize_nvfp4_heads_rope"
    x = _check_input(x, who)
    _check_tables(x, cos, sin, who)
    b, h, s, d = x.shape
    if d < 32:
        raise ValueError(
            f"{who}: the head dim must be at least 32 (a half row holds whole 16-element blocks), got {d}"
        )
    if s == 0:
        raise ValueError(f"{who}: no tokens (S = 0); the per-head global scale is undefined")
    heads = _heads_option(heads, NVFP4_HEADS)
    layout = (h, s, *x.stride()[:3])
    amax, bad = amax_and_flag_words(zeroed, (b * h,), x.device, who)
    amax_rows = 64
    by_bits = interpreted()
    launcher(_head_amax_rope_kernel)[(_programs(x, amax_rows, heads),)](
        x,
        amax,
        bad,
        cos,
        sin,
        *layout,
        D=d,
        ROWS=amax_rows,
        HEADS=heads,
        BY_BITS=by_bits,
        num_warps=4,
        enable_fp_fusion=False,
    )
    g, payload, scales, dec, tok = nvfp4_head_outputs(x)
    rows = _rows_option(who, rows, max(1, 2048 // d))
    launcher(_nvfp4_rope_rows_kernel)[(_programs(x, rows, heads),)](
        x,
        amax,
        bad,
        payload,
        scales,
        dec,
        g,
        tok,
        cos,
        sin,
        *layout,
        D=d,
        ROWS=rows,
        HEADS=heads,
        FAST_DIV=not interpreted(),
        BY_BITS=by_bits,
        num_warps=num_warps,
        enable_fp_fusion=False,
    )
    return NVFP4Tensor(payload=payload, block_scale=scales, global_scale=g), dec, tok


def _heads_option(heads: int | None, default: int = DEFAULT_HEADS) -> int:
    if heads is None:
        return default
    if heads < 1:
        raise ValueError(f"heads per program must be >= 1, got {heads}")
    return heads


def quantize_fp8_rows_pair_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    rope_q: tuple[torch.Tensor, torch.Tensor],
    rope_k: tuple[torch.Tensor, torch.Tensor],
    fmt: str = "e4m3",
    *,
    rows: int | None = None,
    heads: int | None = None,
    num_warps: int = 4,
) -> tuple[FP8Tensor, FP8Tensor]:
    """Per-token FP8 of RoPE'd Q and K in one launch: the bytes of
    ``quant.quantize_fp8_rows_pair(apply_rope(q, *rope_q), apply_rope(k, *rope_k), fmt)``.

    Args:
        q, k: CUDA ``[B, Hq, Sq, D]`` and ``[B, Hkv, Sk, D]`` (BF16 or FP32) of one head dim, any
            strides with a unit last one (read in place), D a power of two <= 256.
        rope_q, rope_k: ``(cos, sin)`` tables of Q's and K's positions, contiguous FP32 ``[S, D/2]``
            (``numerics.rope.rope_tables``; the same pair for both in self-attention).
        rows, heads, num_warps: positions per program (a power of two, default 16), heads per
            program (default :data:`PAIR_HEADS`, 2) and warps: launch options; the bytes do not depend
            on them.
    Returns:
        two :class:`FP8Tensor`, data ``[B, H, S, D]`` and scale ``[B, H, S, 1]``, contiguous.
    Raises:
        ValueError: not CUDA (outside the interpreter), not 4-D, head dims or devices that differ, D
            not a power of two <= 256, tables of another shape, dtype or device, or elements spanning
            2^31 or more.
    """
    who = "quantize_fp8_rows_pair_rope"
    q, k = _check_input(q, who), _check_input(k, who)
    if q.shape[-1] != k.shape[-1] or q.device != k.device:
        raise ValueError(
            f"{who}: Q and K need one head dim and one device, got {q.shape[-1]} on {q.device} and "
            f"{k.shape[-1]} on {k.device}"
        )
    _check_tables(q, *rope_q, who)
    _check_tables(k, *rope_k, who)
    dtype, fmax = FP8_FORMATS[fmt]
    rows = _rows_option(who, rows, DEFAULT_ROWS)
    heads = _heads_option(heads, PAIR_HEADS)
    operands, outs = [], []
    for x, (cos, sin) in ((q, rope_q), (k, rope_k)):
        y = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
        s = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
        operands += [x, y, s, cos, sin, x.shape[1], x.shape[2], *x.stride()[:3]]
        outs.append(FP8Tensor(data=y.view(dtype), scale=s))
    n_q = _programs(q, rows, heads)
    total = n_q + _programs(k, rows, heads)
    if total:
        launcher(_fp8_rope_pair_kernel)[(total,)](
            *operands,
            n_q,
            D=q.shape[-1],
            FMAX=fmax,
            E5M2=fmt == "e5m2",
            ROWS=rows,
            HEADS=heads,
            BY_BITS=interpreted(),
            num_warps=num_warps,
            enable_fp_fusion=False,
        )
    return outs[0], outs[1]
