"""Triton side of the Q/K rotation (``numerics/rotation.py``): the FWHT butterfly on register tiles,
and the two small kernels around the quantizers.

* :func:`fwht_rows` / :func:`rotate_rows` (``@triton.jit`` helpers): ``[ROWS, D]`` FP32 tiles
  through the same stages, in the same order, as ``numerics.rotation.fwht``: stage h reshapes to
  ``[ROWS, D / 2h, 2, h]``, moves the pair axis last, splits it into (a, b) and joins
  (a + b, a - b). The quantizer kernels of ``quant_fp8.py`` and ``quant_nvfp4.py`` call
  :func:`rotate_rows` on the tile they load, before the scales are formed, so the rotation costs no
  pass over memory there; the FP32 bits equal the reference's (IEEE additions in a fixed order; the
  sign multiply is exact and the final multiply by ``fp32(D^-1/2)`` is the reference's one
  rounding).
* :func:`rotated_row_amax`: per row, ``max |x H|`` (NaN for a row holding a NaN or Inf): the
  input of the per-head NVFP4 global scale, which must be known before the blocks are quantized.
  It replaces the torch amax pass over BF16 Q/K that the unrotated path pays.
* :func:`unrotate_rows`: the backward's ``dQ H^T`` / ``dK H^T``, FP32 ``[..., D]`` in, BF16 out,
  one read and one write (a separate kernel after the dQ and dK/dV kernels).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...numerics.rotation import check_rotation_head_dim, inv_sqrt_dim
from .launch import cdiv, launcher

__all__ = ["fwht_rows", "rotate_rows", "rotated_row_amax", "rotation_args", "unrotate_rows"]


@triton.jit
def _butterfly_stage(x, ROWS: tl.constexpr, D: tl.constexpr, H: tl.constexpr):
    """Stage h = H of the butterfly on ``x [ROWS, D]``: (x_i, x_{i+H}) -> (a + b, a - b)."""
    y = tl.permute(tl.reshape(x, [ROWS, D // (2 * H), 2, H]), [0, 1, 3, 2])
    a, b = tl.split(y)
    y = tl.permute(tl.join(a + b, a - b), [0, 1, 3, 2])
    return tl.reshape(y, [ROWS, D])


@triton.jit
def fwht_rows(x, ROWS: tl.constexpr, D: tl.constexpr, LOG2_D: tl.constexpr):
    """``x @ Had_D`` of an FP32 ``[ROWS, D]`` tile, stages h = 1, 2, ..., D/2 in that order."""
    for s in tl.static_range(LOG2_D):
        x = _butterfly_stage(x, ROWS, D, 1 << s)
    return x


@triton.jit
def rotate_rows(
    x, SIGNS, ROWS: tl.constexpr, D: tl.constexpr, LOG2_D: tl.constexpr, INV_SQRT_D: tl.constexpr
):
    """``x H = FWHT(x * s) * fp32(D^-1/2)`` of an FP32 ``[ROWS, D]`` tile; ``SIGNS``: FP32 ``[D]``."""
    s = tl.load(SIGNS + tl.arange(0, D))
    return fwht_rows(x * s[None, :], ROWS, D, LOG2_D) * INV_SQRT_D


@triton.jit
def _load_rows(X, n_rows, ROWS: tl.constexpr, D: tl.constexpr):
    """This program's ``[ROWS, D]`` tile of a contiguous ``[n_rows, D]`` tensor, as FP32 (zeros past
    the end), with its row and column indices and the row mask."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, D)
    ok = r < n_rows
    x = tl.load(X + r[:, None] * D + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    return x, r, d, ok


@triton.jit
def _row_amax_kernel(
    X, A, n_rows, D: tl.constexpr, ROWS: tl.constexpr, SIGNS, LOG2_D: tl.constexpr, INV_SQRT_D: tl.constexpr
):
    x, r, d, ok = _load_rows(X, n_rows, ROWS, D)
    ax = tl.abs(rotate_rows(x, SIGNS, ROWS, D, LOG2_D, INV_SQRT_D))
    bad = tl.max(((ax != ax) | (ax == float("inf"))).to(tl.int32), 1) > 0
    amax = tl.max(tl.where(ax == ax, ax, 0.0), 1)
    tl.store(A + r, tl.where(bad, float("nan"), amax), mask=ok)


@triton.jit
def _unrotate_kernel(
    G, Y, n_rows, D: tl.constexpr, ROWS: tl.constexpr, SIGNS, LOG2_D: tl.constexpr, INV_SQRT_D: tl.constexpr
):
    g, r, d, ok = _load_rows(G, n_rows, ROWS, D)
    s = tl.load(SIGNS + d)
    y = (fwht_rows(g, ROWS, D, LOG2_D) * INV_SQRT_D) * s[None, :]
    tl.store(Y + r[:, None] * D + d[None, :], y.to(Y.dtype.element_ty), mask=ok[:, None])


def rotation_args(x: torch.Tensor, signs: torch.Tensor) -> dict:
    """The kernel arguments of the rotation of ``x [..., D]``: ``SIGNS``, ``LOG2_D``, ``INV_SQRT_D``.

    Raises:
        ValueError: D not a power of two in [16, 256], or ``signs`` not FP32 ``[D]`` on x's device.
    """
    d = x.shape[-1]
    check_rotation_head_dim(d)
    if d < 16 or d > 256:
        raise ValueError(f"Q/K rotation kernels: last dim must be a power of two in [16, 256], got {d}")
    if signs.shape != (d,) or signs.dtype != torch.float32 or signs.device != x.device:
        raise ValueError(
            f"Q/K rotation kernels: signs must be FP32 [{d}] on {x.device}, got {signs.dtype} "
            f"{tuple(signs.shape)} on {signs.device}"
        )
    return dict(SIGNS=signs, LOG2_D=d.bit_length() - 1, INV_SQRT_D=inv_sqrt_dim(d))


def _launch_rows(kernel, x: torch.Tensor, out: torch.Tensor, signs: torch.Tensor, who: str) -> torch.Tensor:
    """Run a row kernel of this module over the rows of ``x [..., D]`` (1024 elements a program)."""
    if not x.is_cuda or not x.is_contiguous():
        raise ValueError(f"{who}: needs a contiguous CUDA tensor")
    args = rotation_args(x, signs)
    d = x.shape[-1]
    n, rows = x.numel() // d, max(1, 1024 // d)
    launcher(kernel)[(cdiv(n, rows),)](x, out, n, D=d, ROWS=rows, **args, num_warps=4)
    return out


def rotated_row_amax(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """Per row of ``x [..., D]`` (contiguous CUDA, BF16 or FP32), ``max_i |(x H)_i|`` in FP32.

    Returns:
        FP32 ``[..., 1]``: exactly ``rotation.rotate(x, signs).abs().amax(-1, keepdim=True)`` for a
        finite row, NaN for a row holding a NaN or Inf (so that an amax over rows is NaN, as the
        reference's is). ``quant.nvfp4_global_scale(result, dims=(2, 3))`` is then the per-head
        global scale of the rotated tensor.
    Raises:
        ValueError: not contiguous CUDA, D not a power of two in [16, 256], or bad ``signs``.
    """
    out = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    return _launch_rows(_row_amax_kernel, x, out, signs, "rotated_row_amax")


def unrotate_rows(g: torch.Tensor, signs: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``g H^T = (FWHT(g) * fp32(D^-1/2)) * s`` per row of ``g [..., D]`` (contiguous CUDA, FP32),
    written in ``dtype`` (BF16: the gradient the backend returns; FP32 for tests).

    Returns:
        ``dtype`` tensor shaped like ``g``: ``rotation.unrotate(g, signs).to(dtype)`` to the bit.
    Raises:
        ValueError: as :func:`rotated_row_amax`.
    """
    out = torch.empty(g.shape, dtype=dtype, device=g.device)
    return _launch_rows(_unrotate_kernel, g, out, signs, "unrotate_rows")
