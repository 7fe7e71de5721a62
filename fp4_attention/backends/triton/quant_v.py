"""Triton quantizer of V for the FP8 PV product: per channel (amax over the keys, the scale a power of two)
to E4M3, written transposed ``[B, H, D, S]`` in the same pass (the K-major B operand of the FP8 PV
product), optionally with its keys permuted within each 16 for the CuTe kernel
(``pv_layout.V_PERM16``) and padded to a multiple of 16.

Two kernels: the amax pass (:func:`amax_rows_per_program` keys per program, atomic max per channel)
and the codes kernel, which multiplies by the exact reciprocal of the power-of-two scale (the same
quotient as ``div_rn``, rounded once). Bytes equal ``numerics.quant``'s (``quant_common``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...numerics.quant import FP8_FORMATS, FP8Tensor
from ..pv_layout import padded_keys
from .launch import cdiv, interpreted, launcher
from .quant_common import (
    _check_grid_axis,
    _max_propagating_nan,
    _rows_option,
    amax_and_flag_words,
    check_int32_span,
)

__all__ = ["amax_rows_per_program", "quantize_fp8_v_transposed", "transpose_codes"]

# V's channel scales at or above which the codes kernel multiplies by the exact reciprocal of the
# power of two (below it the reciprocal would overflow: ``div_rn``)
POW2_RECIP_MIN_SCALE = tl.constexpr(2.0**-126)


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
