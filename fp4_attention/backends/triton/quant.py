"""Triton quantizer kernels: their bytes equal the reference quantizers' (``quant.py``) bytes.

The reference's float32 values, rounded as it rounds them: IEEE round-to-nearest division
(``div_rn``; Triton's ``/`` is an approximate division), or for V's power-of-two channel scale a
multiply by its exact reciprocal (the same quotient, rounded once); the hardware's
round-to-nearest-even FP8 conversion, which saturates, so the rows kernel leaves out the
reference's clamp to the format's largest value (same codes). ``tests/backends/test_triton_quant.py``
checks the bytes against the reference on the same GPU input, including zero rows, zero blocks and
NaN/Inf.
A row's or a block's NaN/Inf is found by one NaN-propagating max per element (the amax itself),
not by per-element tests: on the H200 those had the rows kernel bound by the ALU pipe
(``results/quant_alu_h200``). The NVFP4 rows kernel also rounds to E2M1 with magic addends
(``_e2m1_round``) and divides by each block's denominator through one reciprocal per block and
``div_rn``'s own three-FFMA fast path (``_block_quotients``): 0.277 -> 0.179 ms for Q at B4 H32
S4096 D128 with its amax pass (``results/quant_fast_div_h200``); then per-block masks instead of
per-element selects, a 3-D grid, and the fast division decided from the per-head scale: 0.177 ->
0.151 ms by kernel time, 0.69 of the copy's bandwidth (``results/quant_amax_h200``).

* :func:`quantize_fp8_rows`: one FP32 scale per row of the last dim (per token for ``[B, H, S, D]``,
  read in place from any strides with a unit last one: a ``[B, S, H, D]`` or ``[S, B, H, D]``
  tensor needs no copy).
* :func:`quantize_fp8_v_transposed`: V per channel (amax over the sequence, the scale a power of
  two) to E4M3, written transposed ``[B, H, D, S]`` in the same pass (the K-major B operand of the
  FP8 PV product).
* :func:`quantize_nvfp4_rows`: NVFP4 with the global scale given per row (the per-head scale
  broadcast over its rows); also returns ``s_b * q`` decoded to BF16, which is exact and is what
  the Hopper emulation of the NVFP4 QK product multiplies.

With ``signs`` (a Q/K rotation, ``numerics/rotation.py``), :func:`quantize_fp8_rows` and
:func:`quantize_nvfp4_rows` rotate each row they load (``rotation.rotate_rows``: the FWHT
butterfly in registers, bit-equal to the reference's FP32 rotation) before forming the scales, so
the rotation adds no pass over memory; the NVFP4 per-head global scale of the rotated tensor comes
from ``rotation.rotated_row_amax``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...numerics.quant import FP8_FORMATS, FP8Tensor, NVFP4Tensor
from ..pv_layout import padded_keys
from .launch import cdiv, interpreted, launcher
from .rotation import rotate_rows, rotation_args

__all__ = [
    "check_int32_span",
    "interpreted",
    "decode_nvfp4_rows",
    "quantize_fp8_key_groups",
    "quantize_fp8_rows",
    "quantize_fp8_rows_pair",
    "quantize_fp8_v_transposed",
    "quantize_nvfp4_heads",
    "quantize_nvfp4_rows",
]


def check_int32_span(who: str, *tensors: torch.Tensor) -> None:
    """Raise ValueError if a tensor's elements span 2^31 or more (offset of its last element + 1):
    the kernels index with 32-bit offsets. A strided view's span is its storage's, not its numel."""
    for t in tensors:
        if t.is_contiguous():  # the common case, on every launch's path: the span is the numel
            span = t.numel()
        else:
            span = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) if t.numel() else 0
        if span >= 2**31:
            raise ValueError(
                f"{who}: a tensor of shape {tuple(t.shape)} and strides {t.stride()} spans {span} elements, "
                "beyond the kernels' 32-bit offsets (2^31); use a smaller micro-batch or split the heads"
            )


def zeroed_amax_and_flag(shape: tuple[int, ...], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two zeroed accumulators of ``shape`` from one fill (one kernel launch, not two): FP32 for an
    atomic-max amax (+0.0 is the all-zero bit pattern) and int32 for a non-finite flag."""
    both = torch.zeros((2, *shape), dtype=torch.int32, device=device)
    return both[0].view(torch.float32), both[1]


def amax_and_flag_words(
    zeroed: torch.Tensor | None, shape: tuple[int, ...], device, who: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The amax and flag accumulators of an amax pass, :func:`zeroed_amax_and_flag`'s words: a fill of
    their own for ``zeroed`` None, else flat views of ``zeroed`` (the kernels index them), a
    zero-filled contiguous FP32 tensor of ``2 * prod(shape)`` elements on ``device`` (the amax words,
    then the flag's), which a caller zeroes with other words in one fill (one launch for several
    quantizers).

    Raises:
        ValueError: ``zeroed`` of another dtype, size, layout or device.
    """
    if zeroed is None:
        return zeroed_amax_and_flag(shape, device)
    n = math.prod(shape)
    check_fp32_words(zeroed, device, who, "zeroed", 2 * n)
    return zeroed[:n], zeroed[n:].view(torch.int32)


def check_fp32_words(t: torch.Tensor, device, who: str, name: str, size: int | None = None) -> None:
    """Raise ValueError unless ``t`` is a contiguous FP32 tensor on ``device`` (of ``size`` elements,
    one-dimensional, when given): the words a caller hands a kernel to zero or to accumulate into."""
    shape_ok = size is None or tuple(t.shape) == (size,)
    if t.dtype != torch.float32 or not t.is_contiguous() or not shape_ok or t.device != torch.device(device):
        want = f"[{size}] tensor" if size is not None else "tensor"
        raise ValueError(
            f"{who}: {name} must be a contiguous FP32 {want} on {device}, got {t.dtype} {tuple(t.shape)} "
            f"on {t.device} with strides {t.stride()}"
        )


def _row_input(x: torch.Tensor, who: str) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``x`` as the row kernels read it, and their ``(H, SEQ, sxb, sxh, sxs)`` arguments: a contiguous
    ``[..., D]`` tensor is one run of rows; a 4-D ``[B, H, S, D]`` tensor with a unit last stride is
    read in place through its strides (a ``[B, S, H, D]`` or ``[S, B, H, D]`` tensor seen as
    ``[B, H, S, D]``: no copy); one whose last stride is not 1 is copied first.

    Raises:
        ValueError: not a CUDA tensor (outside the interpreter), neither contiguous nor 4-D, or
            elements spanning 2^31 or more (:func:`check_int32_span`).
    """
    if (not x.is_cuda and not interpreted()) or not (x.is_contiguous() or x.dim() == 4):
        raise ValueError(
            f"{who}: needs a CUDA tensor, contiguous or [B, H, S, D]; got {x.device} "
            f"shape {tuple(x.shape)} strides {x.stride()}"
        )
    if x.stride(-1) != 1:  # rows are read as vectors: the head dim must be innermost
        x = x.contiguous()
    check_int32_span(who, x)
    if x.is_contiguous():
        n, d = x.numel() // x.shape[-1], x.shape[-1]
        return x, (1, n, n * d, n * d, d)
    return x, (x.shape[1], x.shape[2], *x.stride()[:3])


# V's channel scales at or above which the codes kernel multiplies by the exact reciprocal of the
# power of two (below it the reciprocal would overflow: ``div_rn``)
POW2_RECIP_MIN_SCALE = tl.constexpr(2.0**-126)


@triton.jit
def _max_propagating_nan(a, b):
    """Combine function of a max reduction that returns NaN if either operand is NaN."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


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


def _rows_option(who: str, rows: int | None, default: int) -> int:
    """The rows launch option (rows per program, or per block of a program for the row
    quantizers): ``default`` for None, else a power of two."""
    if rows is None:
        return default
    if rows < 1 or rows & (rows - 1):
        raise ValueError(f"{who}: rows (per program or per block) must be a power of two, got {rows}")
    return rows


def _blocks_option(who: str, blocks: int) -> int:
    """The blocks-per-program launch option of the row quantizers: the int 1, 2 or 4."""
    if blocks.__class__ is not int or blocks not in (1, 2, 4):
        raise ValueError(f"{who}: blocks per program must be 1, 2 or 4, got {blocks}")
    return blocks


def _rotation_args(x: torch.Tensor, signs: torch.Tensor | None) -> dict:
    """The rotation's kernel arguments (none without ``signs``)."""
    return {} if signs is None else {**rotation_args(x, signs), "ROTATE": True}


# V's amax pass reads AMAX_BLOCK keys per step of a loop over a program's run of keys, keeps an
# elementwise NaN-propagating max in registers and reduces it once, then atomically combines it with the
# other programs' (two atomics per channel per program, 256 at D 128, where one step per program paid
# them every 64 keys). 0.0625 -> 0.0425 ms for a Q-sized V at B4 H32 S4096 D128 on the H200, kernel time
# (results/quant_amax_h200); the same loop made the per-head amax pass slower (_head_amax_kernel).
AMAX_BLOCK = 64
AMAX_MAX_ROWS = 1024  # rows per program at most
AMAX_MIN_PROGRAMS = 512  # halve a program's rows again while the grid keeps at least this many


def amax_rows_per_program(bh: int, seq: int, rows: int | None = None) -> int:
    """Keys of one (batch, head) that one program of V's amax pass reads (``_v_amax_kernel``):
    ``rows`` if given (a launch option for ``bench/quant_bench.py``), else
    from AMAX_BLOCK doubled up to AMAX_MAX_ROWS while the grid of ``bh * cdiv(seq, rows)`` programs
    stays at AMAX_MIN_PROGRAMS or more. The amax does not depend on it.

    Raises:
        ValueError: ``rows`` not a power-of-two multiple of AMAX_BLOCK.
    """
    if rows is not None:
        if rows < AMAX_BLOCK or rows & (rows - 1):
            raise ValueError(
                f"amax pass: rows per program must be a power of two >= {AMAX_BLOCK}, got {rows}"
            )
        return rows
    r = AMAX_BLOCK
    while r < AMAX_MAX_ROWS and bh * -(-seq // (2 * r)) >= AMAX_MIN_PROGRAMS:
        r *= 2
    return r


@triton.jit
def _v_amax_kernel(
    X, AMAX, BAD, H, S, sxb, sxh, sxs, sxd, D: tl.constexpr, BLOCK_S: tl.constexpr, ROWS: tl.constexpr
):
    """Per (batch, head, channel): whether the channel holds a NaN or Inf, and the amax of |V| over
    the keys (not used for a flagged channel), by atomic max over the programs; each program reads
    ROWS keys, BLOCK_S per step."""
    pid_s, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    d = tl.arange(0, D)
    base = X + b * sxb + h * sxh + d[None, :] * sxd
    # one NaN-propagating max per element (the rows kernel's reason): the amax, and from it the flag
    m = tl.zeros([BLOCK_S, D], dtype=tl.float32)
    for i in tl.range(0, ROWS, BLOCK_S):
        s = pid_s * ROWS + i + tl.arange(0, BLOCK_S)
        x = tl.load(base + s[:, None] * sxs, mask=(s < S)[:, None], other=0.0)
        m = _max_propagating_nan(m, tl.abs(x.to(tl.float32)))
    m = tl.reduce(m, 0, _max_propagating_nan)
    bad = (m != m) | (m == float("inf"))
    tl.atomic_max(BAD + bh * D + d, bad.to(tl.int32))
    tl.atomic_max(AMAX + bh * D + d, tl.where(bad, 0.0, m))


@triton.jit
def _pow2_ceil(s):
    """The smallest power of two >= s, exactly, for finite s > 0 (``quant.pow2_ceil``): a subnormal s
    is scaled by 2^64 first (exact), then the exponent of a mantissa that is not zero goes up by one."""
    sub = s < 1.1754943508222875e-38  # 2^-126
    t = tl.where(sub, s * 18446744073709551616.0, s)
    bits = t.to(tl.int32, bitcast=True)
    up = tl.where((bits & 0x7FFFFF) == 0, bits, (bits & 0x7F800000) + 0x800000).to(tl.float32, bitcast=True)
    return tl.where(sub, up * 5.421010862427522e-20, up)  # 2^-64


@triton.jit
def transpose_codes(yq, PERM16: tl.constexpr):
    """The ``[N, D]`` uint8 codes ``yq`` transposed to ``[D, N]`` (N a multiple of 16 if ``PERM16``),
    for a store contiguous along N. ``PERM16``: within each 16 of N, entry ``j = 8h + 2q + c`` goes
    to slot ``4q + 2h + c`` (``pv_layout.V_PERM16``), a register permutation. The transpose moves
    32-bit lanes (the codes widened, then narrowed back): on the H200 that took the dO quantizer
    from 0.363 to 0.282 ms at B4 H32 S4096 D128 against the byte transpose (same run), and left V's
    codes kernel where it was (``results/prep_transpose_h200/README.md``)."""
    yt = tl.trans(yq.to(tl.int32))
    if PERM16:
        d: tl.constexpr = yt.shape[0]
        n: tl.constexpr = yt.shape[1]
        yt = tl.reshape(tl.permute(tl.reshape(yt, [d, n // 16, 2, 4, 2]), [0, 1, 3, 2, 4]), [d, n])
    return yt.to(tl.uint8)


@triton.jit
def _fp8_v_t_kernel(
    X,
    AMAX,
    BAD,
    SC,
    Y,
    H,
    S,
    SO,
    sxb,
    sxh,
    sxs,
    sxd,
    D: tl.constexpr,
    FMAX: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PERM16: tl.constexpr = False,
):
    pid_s = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    ok = s < S
    x = tl.load(X + b * sxb + h * sxh + s[:, None] * sxs + d[None, :] * sxd, mask=ok[:, None], other=0.0)
    # the channel's scale from its amax (quant.amax_scale, then quant.pow2_ceil): IEEE division,
    # rounded up to a power of two; 1 for an all-zero channel, NaN for one holding a NaN or Inf
    amax = tl.load(AMAX + bh * D + d)
    bad = tl.load(BAD + bh * D + d) > 0
    scale = _pow2_ceil(tl.math.div_rn(amax, tl.full([D], FMAX, tl.float32)))
    scale = tl.where(amax == 0.0, 1.0, scale)
    scale = tl.where(bad, float("nan"), scale)
    if pid_s == 0:
        tl.store(SC + bh * D + d, scale)
    # 1 / 2^k is exact, so x 2^-k rounds once, as x / 2^k does (every BF16 pair checked:
    # test_v_reciprocal_equals_div_rn_on_every_bf16_pair); a NaN scale gives NaN either way (its
    # codes become 0x7F below). V's quantizer (both passes) took 13% less time than with div_rn at
    # B4 H32 S4096 (results/quant_alu_h200)
    if tl.min(scale) >= POW2_RECIP_MIN_SCALE:
        y = x.to(tl.float32) * tl.math.div_rn(tl.full([D], 1.0, tl.float32), scale)[None, :]
    else:  # a channel scale below 2^-126: its reciprocal would overflow
        y = tl.math.div_rn(x.to(tl.float32), tl.broadcast_to(scale[None, :], [BLOCK_S, D]))
    # the clamp is redundant before the saturating conversion (the rows kernel leaves it out), but
    # without it this kernel took 0.185 ms instead of 0.125 at B4 H32 S4096 on the H200, same run
    # (results/quant_fast_div_h200), so it stays
    y = tl.minimum(tl.maximum(y, -FMAX), FMAX)
    yq = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    yq = tl.where(bad[None, :], 0x7F, yq).to(tl.uint8)  # canonical NaN code for a non-finite channel
    # [D, BLOCK_S]; the slots of keys past S hold zeros (masked loads), which is the padding up to SO
    # (SO == S without PERM16)
    yt = transpose_codes(yq, PERM16)
    tl.store(Y + bh * D * SO + d[:, None] * SO + s[None, :], yt, mask=(s < SO)[None, :])


def quantize_fp8_v_transposed(
    v: torch.Tensor,
    *,
    perm16: bool = False,
    rows: int | None = None,
    num_warps: int = 4,
    amax_rows: int | None = None,
    zeroed: torch.Tensor | None = None,
) -> FP8Tensor:
    """E4M3 V with one power-of-two FP32 scale per (batch, head, channel), stored transposed.

    Args:
        v: CUDA tensor ``[B, H, S, D]`` (BF16 or FP32, any strides), D a power of two <= 256.
    Returns:
        :class:`FP8Tensor` with ``data [B, H, D, S]`` (contiguous, E4M3) and ``scale [B, H, 1, D]``:
        ``data.transpose(-1, -2)`` and ``scale`` equal ``quant.quantize_fp8(v, "e4m3", dims=(-2,),
        pow2=True)`` byte for byte (scale = amax/448 by IEEE division rounded up to a power of two,
        1 for an all-zero channel, NaN and code 0x7F for a channel holding a NaN or Inf; contract
        §1-2; the power of two keeps the backward's D consistent, ``numerics/reference.py``).
        ``perm16=True`` (the ``cute`` backend's PV operand): ``data [B, H, D, S16]``, S rounded up
        to 16 (``pv_layout.padded_keys``) with padding keys (code 0; 0x7F in a non-finite channel,
        which is NaN anyway), the keys of each 16 permuted so that slot k holds key
        ``pv_layout.V_PERM16[k]`` (``pv_layout.unpermute_v_keys`` inverts it).
        ``rows`` / ``num_warps``: the codes kernel's keys per program (a power of two >= 16,
        default 64) and warps, launch options for ``bench/quant_bench.py``; the bytes do not depend
        on them. ``amax_rows``: keys per program of the amax pass (:func:`amax_rows_per_program`).
        ``zeroed``: the amax pass's words, ``2 * B * H * D`` zeroed FP32 (:func:`amax_and_flag_words`;
        the caller's fill then covers them), default a fill of its own.
    Raises:
        ValueError: not a 4-D CUDA tensor, no keys, D not a power of two <= 256, B * H above
            65,535, a launch option out of range, or ``zeroed`` not as described.
    """
    if (not v.is_cuda and not interpreted()) or v.dim() != 4:
        raise ValueError("quantize_fp8_v_transposed: needs a CUDA tensor [B, H, S, D]")
    b, h, sk, d = v.shape
    if d & (d - 1) or d > 256:
        raise ValueError(f"quantize_fp8_v_transposed: head dim must be a power of two <= 256, got {d}")
    if sk == 0:
        raise ValueError("quantize_fp8_v_transposed: V has no keys (S = 0); its channel scales are undefined")
    check_int32_span("quantize_fp8_v_transposed", v)
    _check_grid_axis("quantize_fp8_v_transposed", b * h, "B * H")
    _, fmax = FP8_FORMATS["e4m3"]
    # two passes (the amax of every channel, then the scale and the codes): no torch op in between
    amax, bad = amax_and_flag_words(zeroed, (b * h, d), v.device, "quantize_fp8_v_transposed")
    scale = torch.empty((b, h, 1, d), dtype=torch.float32, device=v.device)
    so = padded_keys(sk) if perm16 else sk
    y = torch.empty((b, h, d, so), dtype=torch.uint8, device=v.device)
    block_s = _rows_option("quantize_fp8_v_transposed", rows, 64)
    if block_s < 16:
        raise ValueError(f"quantize_fp8_v_transposed: keys per program must be >= 16, got {block_s}")
    amax_rows = amax_rows_per_program(b * h, sk, amax_rows)
    launcher(_v_amax_kernel)[(cdiv(sk, amax_rows), b * h)](
        v, amax, bad, h, sk, *v.stride(), D=d, BLOCK_S=AMAX_BLOCK, ROWS=amax_rows
    )
    launcher(_fp8_v_t_kernel)[(cdiv(sk, block_s), b * h)](
        v,
        amax,
        bad,
        scale,
        y,
        h,
        sk,
        so,
        *v.stride(),
        D=d,
        FMAX=fmax,
        BLOCK_S=block_s,
        PERM16=perm16,
        num_warps=num_warps,
    )
    return FP8Tensor(data=y.view(torch.float8_e4m3fn), scale=scale)


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


def _check_grid_axis(who: str, n: int, what: str) -> None:
    """A quantizer's grid puts ``n`` programs (``what``: the batch, the heads, or both) on its y or z
    axis, which CUDA caps at 65,535.

    Raises:
        ValueError: ``n`` above the cap.
    """
    if n > 65535:
        raise ValueError(
            f"{who}: {what} = {n} exceeds the 65,535 programs of a CUDA grid's y or z axis; "
            "quantize a smaller micro-batch at a time, or pass a contiguous tensor (one run of rows)"
        )


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


@triton.jit
def _head_amax_kernel(
    X,
    AMAX,
    BAD,
    H,
    SEQ,
    sxb,
    sxh,
    sxs,
    D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    VS=None,
    G=1,
    CHANNEL_SCALED: tl.constexpr = False,
):
    """Per (batch, head) of ``X [B, H, S, D]`` (any strides, unit last): whether the head holds a NaN
    or Inf, and the amax of |x| over its blocks of rows without one (the amax of a flagged head is
    not used), by atomic max over the blocks.
    ``CHANNEL_SCALED``: of ``|x * vs|`` instead, ``vs`` FP32 ``[B, H // G, D]`` per channel, shared
    by the G heads of a group (dO times V's channel scales: ``dout_quant``). One block of rows per
    program: looping over 1,024 rows per program, as V's amax pass does, took 0.072 ms instead of
    0.044 for Q at B4 H32 S4096 D128 on the H200 (kernel time, results/quant_amax_h200)."""
    pid_s, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    x = tl.load(X + b * sxb + h * sxh + s[:, None] * sxs + d[None, :], mask=(s < SEQ)[:, None], other=0.0)
    x = x.to(tl.float32)
    if CHANNEL_SCALED:
        x = x * tl.load(VS + (b * (H // G) + h // G) * D + d)[None, :]
    # one NaN-propagating max per element (the rows kernel's reason); the block's flag and its finite amax
    m = tl.reduce(tl.reduce(tl.abs(x), 1, _max_propagating_nan), 0, _max_propagating_nan)
    bad = (m != m) | (m == float("inf"))
    tl.atomic_max(BAD + bh, bad.to(tl.int32))
    tl.atomic_max(AMAX + bh, tl.where(bad, 0.0, m))


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
def e4m3_to_bf16(c):
    """E4M3 codes (uint8) -> their BF16 values, exact; codes 0x7F and 0xFF (E4M3's NaN) -> NaN
    explicitly (the Triton interpreter's converter decodes them as +-480)."""
    x = c.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return tl.where((c & 0x7F) == 0x7F, float("nan"), x).to(tl.bfloat16)


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
