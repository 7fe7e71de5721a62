"""What the Triton quantizers share: input checks, the amax words, the per-head amax pass, E4M3 decode.

Every quantizer's bytes equal the reference quantizers' (``numerics/quant.py``). The reference's
float32 values, rounded as it rounds them: IEEE round-to-nearest division (``div_rn``; Triton's
``/`` is an approximate division), or for V's power-of-two channel scale a multiply by its exact
reciprocal (the same quotient, rounded once); the hardware's round-to-nearest-even FP8 conversion,
which saturates, so the rows kernels leave out the reference's clamp to the format's largest value
(same codes). ``tests/backends/test_triton_quant.py`` checks the bytes against the reference on the
same GPU input, including zero rows, zero blocks and NaN/Inf.

A row's or a block's NaN/Inf is found by one NaN-propagating max per element (the amax itself,
:func:`_max_propagating_nan`), not by per-element tests: on the H200 those had the rows kernel
bound by the ALU pipe (``results/quant_alu_h200``).

The quantizers, one module each: ``quant_fp8`` (E4M3/E5M2 per row, Q and K in one launch, K per
group of keys), ``quant_v`` (V per channel, transposed, in the CuTe kernel's key order),
``quant_nvfp4`` (NVFP4 with a per-row or per-head global scale, and its BF16 decode).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .launch import interpreted
from .rotation import rotation_args

__all__ = [
    "amax_and_flag_words",
    "check_fp32_words",
    "check_int32_span",
    "e4m3_to_bf16",
    "zeroed_amax_and_flag",
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


@triton.jit
def _max_propagating_nan(a, b):
    """Combine function of a max reduction that returns NaN if either operand is NaN."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


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


@triton.jit
def e4m3_to_bf16(c):
    """E4M3 codes (uint8) -> their BF16 values, exact; codes 0x7F and 0xFF (E4M3's NaN) -> NaN
    explicitly (the Triton interpreter's converter decodes them as +-480)."""
    x = c.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return tl.where((c & 0x7F) == 0x7F, float("nan"), x).to(tl.bfloat16)
