"""The K and V operands of the CuTe backwards from the forward's saved payloads, in one Triton
kernel (one pass over K and V; torch needs a cast, a gather and a transposing copy for them).

- ``kb``: the B operand of dQ = dS K (BF16 wgmma): ``BF16(k8 * col2)`` for E4M3 K (``fp8``: the
  token scale in the operand, ``reference_backward``'s placement; nearest even), or the exact NVFP4
  decode ``s_b * q`` (``nvfp4qk_fp8pv``, without the global scale), which is also the A operand of
  its recomputed S^T = K Q^T.
- ``v8``: E4M3 V ``[B, Hkv, Sk, D]`` in key order, the B operand of dP = dO V^T (an FP8 wgmma takes
  K-major operands only), from the forward's PV operand ``[B, Hkv, D, Sk16]`` whose keys of each 16
  are permuted (``pv_layout.V_PERM16``): the same bytes as ``pv_layout.unpermute_v_keys(vt,
  Sk).transpose(-1, -2)``.
- ``col``, ``col2``: FP32 ``[B, Hkv, Sk]`` per-key scales of the kernel: the K token scales (NVFP4:
  the global scale of the key's head, written here rather than broadcast by a copy) and ``col *
  2^-LIFT``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...numerics.quant import NVFP4Tensor
from .launch import cdiv, launcher
from .launch import interpreted as _interpreted
from .quant_common import check_int32_span, e4m3_to_bf16
from .quant_nvfp4 import nvfp4_to_bf16

__all__ = ["KV_BLOCK", "backward_kv_operands"]

KV_BLOCK = 64  # keys per program


@triton.jit
def _bwd_kv_kernel(
    K8,
    KSC,
    VT,
    KB,
    V8,
    KS,
    COL,
    COL2,
    SK,
    SK16,
    sksh,
    skss,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    K_NVFP4: tl.constexpr,
    WRITE_COL: tl.constexpr,
    COL2_SCALE: tl.constexpr,
):
    pid, bh = tl.program_id(0), tl.program_id(1)
    j = pid * BLOCK + tl.arange(0, BLOCK)  # keys; in VT, slots
    d = tl.arange(0, D)
    ok = j < SK
    # the per-key scale vectors of the kernel: col (written only when KS is not already one) and
    # col2 = col * 2^-LIFT (exact: a power of two)
    ks = tl.load(KS + bh * sksh + j * skss, mask=ok, other=0.0)
    if WRITE_COL:
        tl.store(COL + bh * SK + j, ks, mask=ok)
    tl.store(COL2 + bh * SK + j, ks * COL2_SCALE, mask=ok)
    rows = bh * SK * D + j[:, None] * D + d[None, :]
    if K_NVFP4:  # K8: packed E2M1 [.., D / 2], KSC: E4M3 block scales [.., D / 16]
        key = bh * SK + j[:, None]
        packed = tl.load(K8 + key * (D // 2) + tl.arange(0, D // 2)[None, :], mask=ok[:, None], other=0)
        scales = tl.load(KSC + key * (D // 16) + tl.arange(0, D // 16)[None, :], mask=ok[:, None], other=0)
        kb = nvfp4_to_bf16(packed, scales, BLOCK, D)
    else:  # BF16(k * col2)
        kb = e4m3_to_bf16(tl.load(K8 + rows, mask=ok[:, None], other=0))
        kb = (kb.to(tl.float32) * (ks * COL2_SCALE)[:, None]).to(tl.bfloat16)
    tl.store(KB + rows, kb, mask=ok[:, None])
    vt = tl.load(VT + bh * D * SK16 + d[:, None] * SK16 + j[None, :], mask=(j < SK16)[None, :], other=0)
    # slot 4 q + 2 h + c of each 16 holds key 8 h + 2 q + c: (q, h, c) -> (h, q, c), then keys-major
    v = tl.reshape(tl.permute(tl.reshape(vt, [D, BLOCK // 16, 4, 2, 2]), [0, 1, 3, 2, 4]), [D, BLOCK])
    v = tl.trans(v)
    tl.store(V8 + rows, v, mask=ok[:, None])


def backward_kv_operands(k8, vt_perm: torch.Tensor, *, col2_scale: float) -> dict:
    """``kb``, ``v8``, ``col``, ``col2`` for the CuTe backwards (module docstring).

    Args:
        k8: the saved K: E4M3 (``torch.float8_e4m3fn``) ``[B, Hkv, Sk, D]``, contiguous, with its
            :class:`FP8Tensor` token scales, or an :class:`NVFP4Tensor` of that shape (payload and
            block scales contiguous; its per-head global scale ``[B, Hkv, 1, 1]``).
        vt_perm: E4M3 ``[B, Hkv, D, Sk16]``, contiguous, Sk16 = Sk rounded up to 16 with the keys of
            each 16 in ``pv_layout.V_PERM16`` order (``quantize_fp8_v_transposed(v, perm16=True)``).
        col2_scale: the factor of ``col2`` (2^-LIFT), a power of two.
    Returns:
        dict: ``kb`` BF16 ``[B, Hkv, Sk, D]``: ``BF16(k8 * col2)`` (nearest even) for E4M3, or
        ``scaled_payload()`` (exact) for NVFP4;
        ``v8`` E4M3 ``[B, Hkv, Sk, D]`` in key order; ``col`` FP32 ``[B, Hkv, Sk]``, the
        K token scales (NVFP4: the global scale of each key's head) and ``col2 = col * col2_scale``.
        All contiguous; ``col`` is the saved token scales themselves for E4M3.
    Raises:
        ValueError: CPU tensors (outside the Triton interpreter), wrong dtypes, shapes or layouts, a
            head dim that is not a power of two in 16..256, or a span beyond 32-bit offsets.
    """
    nvfp4 = isinstance(k8, NVFP4Tensor)
    payload = k8.payload if nvfp4 else k8.data
    b, h, sk, d = k8.shape if nvfp4 else payload.shape
    sk16 = -(-sk // 16) * 16
    if not payload.is_cuda and not _interpreted():
        raise ValueError("backward_kv_operands: needs CUDA tensors (the CuTe backward runs on sm_90)")
    if nvfp4:
        k_ok = (
            payload.dtype == torch.uint8
            and payload.is_contiguous()
            and k8.block_scale.is_contiguous()
            and tuple(k8.block_scale.shape) == (b, h, sk, d // 16)
            and tuple(k8.global_scale.shape) in ((b, h, 1, 1), (b, h))
        )
    else:
        k_ok = payload.dtype == torch.float8_e4m3fn and payload.is_contiguous() and k8.scale.is_contiguous()
    if (
        not k_ok
        or vt_perm.dtype != torch.float8_e4m3fn
        or tuple(vt_perm.shape) != (b, h, d, sk16)
        or not vt_perm.is_contiguous()
        or d & (d - 1)
        or not 16 <= d <= 256
    ):
        raise ValueError(
            f"backward_kv_operands: needs a contiguous float8_e4m3fn (or NVFP4: uint8 payload, block scales "
            f"[B, Hkv, Sk, D / 16], a per-head global scale [B, Hkv, 1, 1]) k8 [B, Hkv, Sk, D] and "
            f"vt_perm [B, Hkv, D, Sk16] = {(b, h, d, sk16)} with D a power of two in 16..256; got "
            f"{'NVFP4' if nvfp4 else payload.dtype} {(b, h, sk, d)} / {vt_perm.dtype} {tuple(vt_perm.shape)}"
        )
    check_int32_span("backward_kv_operands", payload, vt_perm)
    # the per-key scale source: a per-head scale for NVFP4 (stride 0 over the keys), the token scales
    if nvfp4:
        ks, ks_strides = k8.global_scale.reshape(b * h).float().contiguous(), (1, 0)
    else:
        ks, ks_strides = k8.scale, (sk, 1)
    dev = payload.device
    kb = torch.empty((b, h, sk, d), dtype=torch.bfloat16, device=dev)
    v8 = torch.empty((b, h, sk, d), dtype=torch.uint8, device=dev)
    cols = torch.empty((2 if nvfp4 else 1, b, h, sk), dtype=torch.float32, device=dev)
    col = cols[1] if nvfp4 else k8.scale.view(b, h, sk)
    launcher(_bwd_kv_kernel)[(cdiv(sk, KV_BLOCK), b * h)](
        payload.view(torch.uint8),
        k8.block_scale if nvfp4 else None,
        vt_perm.view(torch.uint8),
        kb,
        v8,
        ks,
        col,
        cols[0],
        sk,
        sk16,
        *ks_strides,
        D=d,
        BLOCK=KV_BLOCK,
        K_NVFP4=nvfp4,
        WRITE_COL=nvfp4,
        COL2_SCALE=float(col2_scale),
    )
    return {
        "kb": kb,
        "v8": v8.view(torch.float8_e4m3fn),
        "col": col,
        "col2": cols[0],
    }
