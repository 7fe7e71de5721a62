"""Triton FP8 quantizers per row (E4M3 or E5M2, one FP32 scale per row: Q/K per token), Q and K in one
launch, K per group of keys.

* :func:`quantize_fp8_rows`: one FP32 scale per row of the last dim (per token for ``[B, H, S, D]``,
  read in place from any strides with a unit last one: a ``[B, S, H, D]`` or ``[S, B, H, D]``
  tensor needs no copy).
* :func:`quantize_fp8_rows_pair`: Q's rows and then K's in one grid (one launch), the same program.
* :func:`quantize_fp8_key_groups`: K with one scale per ``keys`` consecutive keys (recipe option
  ``k_scale_keys``).

Bytes equal ``numerics.quant``'s (``quant_common``'s docstring: rounding, NaN/Inf). With ``signs`` (a
Q/K rotation, ``numerics/rotation.py``) each row is rotated as it is loaded (``rotation.rotate_rows``:
the FWHT butterfly in registers, bit-equal to the reference's FP32 rotation) before its scale is
formed, so the rotation adds no pass over memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...numerics.quant import FP8_FORMATS, FP8Tensor
from .launch import cdiv, interpreted, launcher
from .quant_common import (
    _blocks_option,
    _max_propagating_nan,
    _rotation_args,
    _row_input,
    _rows_option,
    check_fp32_words,
    check_int32_span,
)
from .rotation import rotate_rows

__all__ = ["quantize_fp8_key_groups", "quantize_fp8_rows", "quantize_fp8_rows_pair"]


@triton.jit
def _row_offsets(r, H, SEQ, sxb, sxh, sxs):
    """Element offset of row ``r`` (``(b, h, s)`` of the contiguous ``[B, H, S, D]`` output) in X."""
    return (r // (H * SEQ)) * sxb + ((r // SEQ) % H) * sxh + (r % SEQ) * sxs


@triton.jit
def _fp8_rows_program(
    pid,
    X,
    Y,
    S,
    n_rows,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    D: tl.constexpr,
    FMAX: tl.constexpr,
    E5M2: tl.constexpr,
    ROWS: tl.constexpr,
    SIGNS,
    ROTATE: tl.constexpr,
    LOG2_D: tl.constexpr,
    INV_SQRT_D: tl.constexpr,
    BLOCKS: tl.constexpr = 1,
):
    """Rows ``pid * ROWS * BLOCKS ...`` of one tensor, BLOCKS blocks of ROWS rows one after the
    other, the next block's rows loaded before the current one is quantized: their scales and FP8
    codes (the body of both row kernels)."""
    r = pid * (ROWS * BLOCKS) + tl.arange(0, ROWS)  # row (b, h, s) of the contiguous output
    d = tl.arange(0, D)
    src = _row_offsets(r, H, SEQ, sxb, sxh, sxs)  # any strides of X
    x = tl.load(X + src[:, None] + d[None, :], mask=(r < n_rows)[:, None], other=0.0)
    for i in tl.static_range(BLOCKS):
        if i + 1 < BLOCKS:  # the next block's loads in flight while this one is quantized
            r_next = r + ROWS
            src = _row_offsets(r_next, H, SEQ, sxb, sxh, sxs)  # any strides of X
            x_next = tl.load(X + src[:, None] + d[None, :], mask=(r_next < n_rows)[:, None], other=0.0)
        ok = r < n_rows
        xf = x.to(tl.float32)
        if ROTATE:  # x H in registers, before the row's scale is formed
            xf = rotate_rows(xf, SIGNS, ROWS, D, LOG2_D, INV_SQRT_D)
        # one NaN-propagating max per element: the row's amax, NaN for a row holding a NaN and Inf
        # for one holding an Inf (no per-element NaN/Inf tests: the kernel was bound by the ALU pipe)
        amax = tl.reduce(tl.abs(xf), 1, _max_propagating_nan)
        scale, bad = _fp8_scale(amax, FMAX)
        yq = _fp8_codes(xf, scale[:, None], bad[:, None], E5M2)
        tl.store(Y + r[:, None] * D + d[None, :], yq, mask=ok[:, None])
        tl.store(S + r, scale, mask=ok)
        if i + 1 < BLOCKS:
            x = x_next
            r = r_next


@triton.jit
def _fp8_rows_kernel(
    X,
    Y,
    S,
    n_rows,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    D: tl.constexpr,
    FMAX: tl.constexpr,
    E5M2: tl.constexpr,
    ROWS: tl.constexpr,
    SIGNS=None,
    ROTATE: tl.constexpr = False,
    LOG2_D: tl.constexpr = 0,
    INV_SQRT_D: tl.constexpr = 1.0,
    BLOCKS: tl.constexpr = 1,
):
    _fp8_rows_program(
        tl.program_id(0),
        X,
        Y,
        S,
        n_rows,
        H,
        SEQ,
        sxb,
        sxh,
        sxs,
        D,
        FMAX,
        E5M2,
        ROWS,
        SIGNS,
        ROTATE,
        LOG2_D,
        INV_SQRT_D,
        BLOCKS,
    )


ZERO_WORDS = 1024  # words a program of _fp8_rows_pair_kernel zeroes per step (ZERO_STEPS)
ZERO_BLOCK = tl.constexpr(ZERO_WORDS)


@triton.jit
def _fp8_rows_pair_kernel(
    X,
    Y,
    S,
    n_rows,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    X2,
    Y2,
    S2,
    n_rows2,
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
    SIGNS=None,
    ROTATE: tl.constexpr = False,
    LOG2_D: tl.constexpr = 0,
    INV_SQRT_D: tl.constexpr = 1.0,
    ZERO=None,
    n_zero=0,
    ZERO_STEPS: tl.constexpr = 0,
    BLOCKS: tl.constexpr = 1,
):
    """Two tensors' rows in one launch: programs ``[0, n_programs)`` the first's, the rest the second's.
    With ``ZERO_STEPS`` > 0 every program also zeroes ``ZERO_BLOCK`` words of ``ZERO`` (``n_zero``
    FP32 words) in each of ``ZERO_STEPS`` steps of a grid-stride loop (one at the attention shapes:
    the grid holds a program per few rows of Q and K): another kernel's accumulators, with no fill
    launch of their own."""
    pid = tl.program_id(0)
    if ZERO_STEPS > 0:
        for step in range(ZERO_STEPS):
            offs = (step * tl.num_programs(0) + pid) * ZERO_BLOCK + tl.arange(0, ZERO_BLOCK)
            tl.store(ZERO + offs, tl.zeros([ZERO_BLOCK], tl.float32), mask=offs < n_zero)
    if pid < n_programs:
        _fp8_rows_program(
            pid,
            X,
            Y,
            S,
            n_rows,
            H,
            SEQ,
            sxb,
            sxh,
            sxs,
            D,
            FMAX,
            E5M2,
            ROWS,
            SIGNS,
            ROTATE,
            LOG2_D,
            INV_SQRT_D,
            BLOCKS,
        )
    else:
        _fp8_rows_program(
            pid - n_programs,
            X2,
            Y2,
            S2,
            n_rows2,
            H2,
            SEQ2,
            sxb2,
            sxh2,
            sxs2,
            D,
            FMAX,
            E5M2,
            ROWS,
            SIGNS,
            ROTATE,
            LOG2_D,
            INV_SQRT_D,
            BLOCKS,
        )


@triton.jit
def _fp8_scale(amax, FMAX: tl.constexpr):
    """``(scale, bad)`` of a row or group from its NaN-propagating amax, ``quant.quantize_fp8``'s
    rule: ``amax / FMAX`` correctly rounded, 1 for an all-zero one, NaN for a non-finite one (``bad``:
    its amax is NaN or Inf)."""
    bad = (amax != amax) | (amax == float("inf"))
    scale = tl.math.div_rn(amax, tl.full(amax.shape, FMAX, tl.float32))
    scale = tl.where(amax == 0.0, 1.0, scale)
    return tl.where(bad, float("nan"), scale), bad


@triton.jit
def _fp8_codes(x, scale, bad, E5M2: tl.constexpr):
    """uint8 FP8 codes of ``x / scale`` (``scale`` and ``bad`` broadcast against ``x``), 0x7F where
    ``bad`` (the scale's non-finite amax): ``quant.quantize_fp8``'s rule."""
    # no clamp to +-FMAX before the conversion: it saturates (cvt.rn.satfinite), giving the clamped
    # value's code for every finite y; a non-finite row's codes are set below
    y = tl.math.div_rn(x, scale)
    if E5M2:
        yq = y.to(tl.float8e5).to(tl.uint8, bitcast=True)
    else:
        yq = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return tl.where(bad, 0x7F, yq).to(tl.uint8)  # canonical NaN code for a non-finite row


@triton.jit
def _fp8_key_groups_kernel(
    X,
    Y,
    S,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    D: tl.constexpr,
    FMAX: tl.constexpr,
    KEYS: tl.constexpr,
    SIGNS=None,
    ROTATE: tl.constexpr = False,
    LOG2_D: tl.constexpr = 0,
    INV_SQRT_D: tl.constexpr = 1.0,
):
    # program (g, bh): keys [g KEYS, (g + 1) KEYS) of head bh; one E4M3 scale for all of them
    bh = tl.program_id(1)
    s = tl.program_id(0) * KEYS + tl.arange(0, KEYS)
    d = tl.arange(0, D)
    ok = s < SEQ
    src = (bh // H).to(tl.int64) * sxb + (bh % H) * sxh + s * sxs
    x = tl.load(X + src[:, None] + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    if ROTATE:
        x = rotate_rows(x, SIGNS, KEYS, D, LOG2_D, INV_SQRT_D)
    amax = tl.reduce(tl.reduce(tl.abs(x), 1, _max_propagating_nan), 0, _max_propagating_nan)
    scale, bad = _fp8_scale(amax, FMAX)
    yq = _fp8_codes(x, scale, bad, False)
    r = bh * SEQ + s  # row of the contiguous [B, H, S, D] output
    tl.store(Y + r[:, None] * D + d[None, :], yq, mask=ok[:, None])
    tl.store(S + r, tl.zeros([KEYS], tl.float32) + scale, mask=ok)


def quantize_fp8_key_groups(
    k: torch.Tensor, keys: int = 64, *, signs: torch.Tensor | None = None, num_warps: int = 4
) -> FP8Tensor:
    """E4M3 K with one FP32 scale per ``keys`` consecutive keys of each (batch, head), counted from
    key 0 (recipe option ``k_scale_keys``); bytes equal ``quant.quantize_fp8_key_groups(k, keys)``.

    Args:
        k: CUDA ``[B, H, S, D]`` (BF16 or FP32) with a unit last stride, any other strides (read in
            place); D a power of two <= 256.
        keys: keys per scale, a power of two (the recipes use 64).
        signs: FP32 ``[D]`` signs of a Q/K rotation: quantize ``k H`` (as :func:`quantize_fp8_rows`).
    Returns:
        :class:`FP8Tensor`, data ``[B, H, S, D]`` float8_e4m3fn and scale ``[B, H, S, 1]`` FP32 (the
        group's scale repeated per key), both contiguous.
    Raises:
        ValueError: not a 4-D CUDA tensor, D not a power of two <= 256, ``keys`` not a power of two,
            or elements spanning 2^31 or more (``check_int32_span``).
    """
    if k.dim() != 4 or (not k.is_cuda and not interpreted()):
        raise ValueError(
            f"quantize_fp8_key_groups: needs a CUDA K [B, H, S, D]; got {k.device} {tuple(k.shape)}"
        )
    if k.stride(-1) != 1:
        k = k.contiguous()
    check_int32_span("quantize_fp8_key_groups", k)
    b, h, seq, d = k.shape
    if d & (d - 1) or d > 256:
        raise ValueError(f"quantize_fp8_key_groups: head dim must be a power of two <= 256, got {d}")
    if keys < 1 or keys & (keys - 1):
        raise ValueError(f"quantize_fp8_key_groups: keys per scale must be a power of two, got {keys}")
    dtype, fmax = FP8_FORMATS["e4m3"]
    y = torch.empty(k.shape, dtype=torch.uint8, device=k.device)
    s = torch.empty((b, h, seq, 1), dtype=torch.float32, device=k.device)
    launcher(_fp8_key_groups_kernel)[(cdiv(seq, keys), b * h)](
        k,
        y,
        s,
        h,
        seq,
        *k.stride()[:3],
        D=d,
        FMAX=fmax,
        KEYS=keys,
        num_warps=num_warps,
        **_rotation_args(k, signs),
    )
    return FP8Tensor(data=y.view(dtype), scale=s)


def quantize_fp8_rows(
    x: torch.Tensor,
    fmt: str = "e4m3",
    *,
    signs: torch.Tensor | None = None,
    rows: int | None = None,
    num_warps: int = 4,
    blocks: int = 2,
) -> FP8Tensor:
    """FP8 with one FP32 scale per row of the last dim; bytes equal ``quant.quantize_fp8(x, fmt, (-1,))``.

    Args:
        x: CUDA tensor ``[..., D]`` (BF16 or FP32), D a power of two <= 256; contiguous, or 4-D
            ``[B, H, S, D]`` with any strides (a ``[B, S, H, D]`` or ``[S, B, H, D]`` tensor seen as
            ``[B, H, S, D]`` is read in place; one whose last stride is not 1 is copied first).
        signs: FP32 ``[D]`` signs of a Q/K rotation (``numerics.rotation``): quantize ``x H``,
            rotated in the kernel; bytes equal ``quantize_fp8(rotation.rotate(x, signs), fmt, (-1,))``.
        rows, num_warps: rows per block (a power of two; default 2048 / D) and warps: launch
            options for ``bench/quant_bench.py``, the bytes do not depend on them.
        blocks: blocks of ``rows`` rows per program (a program quantizes ``rows * blocks`` rows),
            each block's loads issued before the previous block is quantized (1, 2 or 4; a launch
            option likewise). Default 2: the Q/K pair at
            B4 H32/8 S4096 D128 took 0.0876 ms of kernel time against 0.0926 at 1 block on an H100
            (``results/quant_blocks_h100``).
    Returns:
        :class:`FP8Tensor` with data ``[..., D]`` and scale ``[..., 1]``, both contiguous.
    Raises:
        ValueError: not a CUDA tensor, not contiguous and not 4-D, D not a power of two <= 256,
            elements spanning 2^31 or more (``check_int32_span``), ``rows`` not a power of two, or
            ``blocks`` not 1, 2 or 4.
    """
    (got,) = _quantize_fp8_row_tensors((x,), fmt, signs, (rows, num_warps, blocks), "quantize_fp8_rows")
    return got


def quantize_fp8_rows_pair(
    x: torch.Tensor,
    x2: torch.Tensor,
    fmt: str = "e4m3",
    *,
    signs: torch.Tensor | None = None,
    rows: int | None = None,
    num_warps: int = 4,
    blocks: int = 2,
    zero: torch.Tensor | None = None,
) -> tuple[FP8Tensor, FP8Tensor]:
    """:func:`quantize_fp8_rows` of two tensors (Q and K) in one kernel launch: the same bytes as two
    calls, one launch's host time less (each Triton launch costs tens of microseconds of host time,
    ``results/host_overhead_h200``).

    Args:
        x, x2: as :func:`quantize_fp8_rows`'s ``x``, of one head dim; their shapes, strides and
            dtypes may differ (``[B, Hq, Sq, D]`` and ``[B, Hkv, Sk, D]``).
        fmt, signs, rows, num_warps, blocks: as :func:`quantize_fp8_rows`, for both.
        zero: a contiguous FP32 tensor on their device that the same launch also zeroes (the cute
            forward's V amax words: one fill launch less; a later kernel on the stream sees zeros).
    Returns:
        the two :class:`FP8Tensor` of :func:`quantize_fp8_rows`.
    Raises:
        ValueError: as :func:`quantize_fp8_rows`, head dims or devices that differ, or a ``zero``
            that is not a contiguous FP32 tensor on their device.
    """
    if x.shape[-1] != x2.shape[-1] or x.device != x2.device:
        raise ValueError(
            f"quantize_fp8_rows_pair: both tensors need one head dim and one device, got {x.shape[-1]} on "
            f"{x.device} and {x2.shape[-1]} on {x2.device}"
        )
    if zero is not None:
        check_fp32_words(zero, x.device, "quantize_fp8_rows_pair", "zero")
    return _quantize_fp8_row_tensors(
        (x, x2), fmt, signs, (rows, num_warps, blocks), "quantize_fp8_rows_pair", zero
    )


def _quantize_fp8_row_tensors(xs, fmt, signs, launch, who, zero=None) -> tuple:
    """One or two tensors' per-row FP8 (``_fp8_rows_kernel`` or ``_fp8_rows_pair_kernel``, which also
    zeroes ``zero``); ``launch``: (rows per block or None, warps, blocks per program)."""
    rows, num_warps, blocks = launch
    prepared = [_row_input(x, who) for x in xs]
    d = prepared[0][0].shape[-1]
    if d & (d - 1) or d > 256:
        raise ValueError(f"{who}: last dim must be a power of two <= 256, got {d}")
    dtype, fmax = FP8_FORMATS[fmt]
    rows = _rows_option(who, rows, max(1, 2048 // d))
    blocks = _blocks_option(who, blocks)
    operands, outs, programs = [], [], []
    for x, layout in prepared:
        y = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
        s = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
        n = x.numel() // d
        operands += [x, y, s, n, *layout]
        outs.append(FP8Tensor(data=y.view(dtype), scale=s))
        programs.append(cdiv(n, rows * blocks))
    kernel = _fp8_rows_kernel if len(xs) == 1 else _fp8_rows_pair_kernel
    if len(xs) == 2:
        operands.append(programs[0])
    launcher(kernel)[(sum(programs),)](
        *operands,
        D=d,
        FMAX=fmax,
        E5M2=fmt == "e5m2",
        ROWS=rows,
        BLOCKS=blocks,
        num_warps=num_warps,
        **_rotation_args(prepared[0][0], signs),
        **_zeroing_args(zero, sum(programs)),
    )
    return tuple(outs)


def _zeroing_args(zero: torch.Tensor | None, n_grid: int) -> dict:
    """``_fp8_rows_pair_kernel``'s arguments that zero ``zero`` across a grid of ``n_grid`` programs
    (none without it)."""
    if zero is None:
        return {}
    n = zero.numel()
    return {"ZERO": zero, "n_zero": n, "ZERO_STEPS": max(1, cdiv(n, n_grid * ZERO_WORDS))}
