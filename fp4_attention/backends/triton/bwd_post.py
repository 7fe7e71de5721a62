"""The CuTe backward's FP32 gradient accumulators -> BF16 dQ (and, for GQA, dK and dV) in one Triton
launch: the work of flash-attn-4's postprocess kernel, which the cute backend launches once per
tensor (three launches for GQA).

The accumulators' layout is the one ``bwd_sm90.FP8BackwardSm90`` writes (FA4's Hopper backward
order): per (batch, head) a flat FP32 run of ``S_pad * D`` values (``S_pad``: Sq rounded up to the
backward's 64 query rows for dQ, Sk to its 128 keys for dK/dV). Each 64-row block of a gradient
is two *units* of ``32 * D`` consecutive values; unit ``ch`` holds the 64 rows' columns
``[ch * D/2, (ch + 1) * D/2)``. Inside a unit, the value of row ``16 w + 8 i + r`` and column
``8 n + 2 q + j`` (w < 4, i < 2, r < 8, n < D/16, q < 4, j < 2) is at

    n * 512 + w * 128 + r * 16 + q * 4 + i * 2 + j,

that is the unit is ``[n][w][r][q][i][j]``. Where it comes from:
- a wgmma accumulator fragment (PTX ISA, "wgmma .m64nNk16 register fragment D"): thread ``t`` of a
  warpgroup (warp ``w = t // 32``, lane ``4 r + q``) holds the rows ``16 w + r + 8 i`` and columns
  ``8 n + 2 q + j`` in its registers ``4 n + 2 i + j``;
- the kernels copy register ``k`` of thread ``t`` into shared memory at ``(k // 4) * 512 + 4 t +
  k % 4`` (128-bit stores of 128 threads, ``r2s_tiled_copy_dQaccum`` and FA4's ``epilogue_dKV``) and
  bulk-add that run into the accumulator;
- dQ (64 query rows per block) is split between the two consumer warpgroups along the head dim
  (warpgroup ``g`` holds columns ``[g D/2, (g+1) D/2)``: unit ``g``); dK and dV (128 keys per
  block) along the keys (warpgroup ``g`` holds the rows ``[64 g, 64 g + 64)`` with every column,
  whose ``n < D/16`` half comes first: units ``2 g`` and ``2 g + 1``).
``tests/backends/test_bwd_post.py`` checks this map against CuTe's own layout algebra for the
kernel's tiled MMAs and copies (on the CPU), and the GPU test against FA4's postprocess, bit for bit.

The conversion is FA4's: ``BF16(acc * scale)``, the product in FP32, nearest even; dQ's scale is
the softmax scale, dK's and dV's 1 (the kernel scaled them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import interpreted as _interpreted
from .launch import launcher
from .quant_common import check_int32_span

__all__ = ["ROWS", "convert_accumulators"]

ROWS = 64  # gradient rows per accumulator block (two units)


@triton.jit
def _unit_to_bf16(ACC, u, w, OUT, NB, H, s_b, s_h, s_s, S, scale, D: tl.constexpr):
    """Unit ``u`` of the accumulator (``[n][w][r][q][i][j]``, module docstring), the ``w``-th of its
    gradient ``OUT`` (``NB`` 64-row blocks per (batch, head), ``H`` heads, strides ``s_b``, ``s_h``,
    ``s_s``): batch-head ``w // (2 NB)``, rows ``64 ((w // 2) % NB)`` on, columns ``(w % 2) D/2``
    on, written as BF16(value * scale); rows at or past ``S`` (padding) not written."""
    bh = w // (2 * NB)
    rows = ((w // 2) % NB) * 64 + tl.arange(0, 64)
    cols = (w % 2) * (D // 2) + tl.arange(0, D // 2)
    out = OUT + (bh // H).to(tl.int64) * s_b + (bh % H) * s_h
    x = tl.load(ACC + u.to(tl.int64) * (32 * D) + tl.arange(0, 32 * D))
    x = tl.reshape(x, [D // 16, 4, 8, 4, 2, 2])
    # [n][w][r][q][i][j] -> [w][i][r][n][q][j]: rows 16 w + 8 i + r, columns 8 n + 2 q + j
    x = tl.reshape(tl.permute(x, [1, 4, 2, 0, 3, 5]), [64, D // 2])
    y = (x * scale).to(tl.bfloat16)
    tl.store(out + rows[:, None] * s_s + cols[None, :], y, mask=(rows < S)[:, None])


@triton.jit
def _bwd_post_kernel(
    ACC,
    DQ,
    DK,
    DV,
    UQ,
    UKV,
    HQ,
    HKV,
    SQ,
    SK,
    NQ,
    NK,
    sq_b,
    sq_h,
    sq_s,
    skv_b,
    skv_h,
    skv_s,
    scale_q,
    D: tl.constexpr,
):
    u = tl.program_id(0)  # the accumulator's units: dQ's (UQ), then dK's and dV's (UKV each, GQA)
    if u < UQ:
        _unit_to_bf16(ACC, u, u, DQ, NQ, HQ, sq_b, sq_h, sq_s, SQ, scale_q, D)
    elif u < UQ + UKV:
        _unit_to_bf16(ACC, u, u - UQ, DK, NK, HKV, skv_b, skv_h, skv_s, SK, 1.0, D)
    else:
        _unit_to_bf16(ACC, u, u - UQ - UKV, DV, NK, HKV, skv_b, skv_h, skv_s, SK, 1.0, D)


def _kv_ok(dk, dv, shape, kv_rows: int, hq: int) -> bool:
    return (
        tuple(dk.shape) == tuple(dv.shape) == shape
        and dk.stride() == dv.stride()
        and kv_rows % ROWS == 0
        and shape[2] <= kv_rows
        and hq % shape[1] == 0
    )


def convert_accumulators(
    acc: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor | None,
    dv: torch.Tensor | None,
    *,
    softmax_scale: float,
    q_rows: int,
    kv_rows: int,
) -> None:
    """Write ``dq`` (and ``dk``, ``dv``) from the CuTe backward's FP32 accumulators, one launch.

    Args:
        acc: FP32, contiguous: dQ's accumulator ``[B, Hq, q_rows * D]`` followed, for GQA, by dK's
            and dV's ``[B, Hkv, kv_rows * D]`` each (``backward_operands``' one buffer; anything after
            them is not read), in the layout of the module docstring.
        dq: BF16 ``[B, Hq, Sq, D]``, unit stride along D (any layout of the other dims: the
            caller's), written with ``BF16(acc * softmax_scale)``.
        dk, dv: BF16 ``[B, Hkv, Sk, D]`` with equal strides and unit stride along D (GQA), written
            with ``BF16(acc)``; both None without GQA (the kernel wrote them).
        softmax_scale: dQ's factor (FP32).
        q_rows, kv_rows: the padded row counts of the accumulators (Sq rounded up to 64; Sk rounded
            up to 128, or to 64 at least: any multiple of 64 >= Sk).
    Raises:
        ValueError: CPU tensors (outside the Triton interpreter), dtypes, shapes or strides other
            than these, a head dim not in (64, 128), padded rows not a multiple of 64 covering the
            rows, an ``acc`` too small, or offsets beyond 32 bits.
    """
    b, hq, sq, d = dq.shape
    gqa = dk is not None
    if not acc.is_cuda and not _interpreted():
        raise ValueError("convert_accumulators: needs CUDA tensors (the CuTe backward runs on sm_90)")
    if (dk is None) != (dv is None):
        raise ValueError("convert_accumulators: dk and dv go together (GQA) or are both None")
    hkv, sk = (dk.shape[1], dk.shape[2]) if gqa else (hq, sq)
    need = b * hq * q_rows * d + (2 * b * hkv * kv_rows * d if gqa else 0)
    grads = (dq, dk, dv) if gqa else (dq,)
    ok = (
        acc.dtype == torch.float32
        and acc.is_contiguous()
        and acc.numel() >= need
        and d in (64, 128)
        and all(t.dtype == torch.bfloat16 and t.dim() == 4 and t.stride(-1) == 1 for t in grads)
        and q_rows % ROWS == 0
        and sq <= q_rows
        and (not gqa or _kv_ok(dk, dv, (b, hkv, sk, d), kv_rows, hq))
    )
    if not ok:
        raise ValueError(
            "convert_accumulators: needs a contiguous FP32 acc of at least "
            f"{need} values, BF16 dq [B, Hq, Sq, D] (and dk, dv [B, Hkv, Sk, D], equal strides) with unit "
            f"stride along D = 64 or 128, padded rows multiples of 64 covering Sq/Sk; got acc {acc.dtype} "
            f"{acc.numel()} values, dq {dq.dtype} {tuple(dq.shape)} {dq.stride()}, dk "
            f"{None if dk is None else (dk.dtype, tuple(dk.shape), dk.stride())}, rows {q_rows}/{kv_rows}"
        )
    check_int32_span("convert_accumulators", *grads)
    nq, nk = q_rows // ROWS, kv_rows // ROWS
    uq = b * hq * nq * 2
    ukv = b * hkv * nk * 2 if gqa else 0
    kv_strides = (dk.stride(0), dk.stride(1), dk.stride(2)) if gqa else (0, 0, 0)
    launcher(_bwd_post_kernel)[(uq + 2 * ukv,)](
        acc,
        dq,
        dk if gqa else dq,
        dv if gqa else dq,
        uq,
        ukv,
        hq,
        hkv,
        sq,
        sk,
        nq,
        nk,
        dq.stride(0),
        dq.stride(1),
        dq.stride(2),
        *kv_strides,
        float(softmax_scale),
        D=d,
    )
