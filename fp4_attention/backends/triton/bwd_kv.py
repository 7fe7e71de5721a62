"""The K and V operands of the CuTe ``fp8`` backward from the forward's saved payloads, in one Triton
kernel (one pass over K and V; torch needs a cast, a gather and a transposing copy for them).

- ``kb``: BF16 image of the E4M3 K payload (exact), the B operand of dQ = dS K (BF16 wgmma).
- ``v8``: E4M3 V ``[B, Hkv, Sk, D]`` in key order, the B operand of dP = dO V^T (an FP8 wgmma takes
  K-major operands only), from the forward's PV operand ``[B, Hkv, D, Sk16]`` whose keys of each 16
  are permuted (``pv_layout.V_PERM16``): the same bytes as ``pv_layout.unpermute_v_keys(vt,
  Sk).transpose(-1, -2)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dout_quant import _interpreted, e4m3_to_bf16

__all__ = ["KV_BLOCK", "backward_kv_operands"]

KV_BLOCK = 64  # keys per program


@triton.jit
def _bwd_kv_kernel(K8, VT, KB, V8, SK, SK16, D: tl.constexpr, BLOCK: tl.constexpr):
    pid, bh = tl.program_id(0), tl.program_id(1)
    j = pid * BLOCK + tl.arange(0, BLOCK)  # keys; in VT, slots
    d = tl.arange(0, D)
    ok = j < SK
    rows = bh * SK * D + j[:, None] * D + d[None, :]
    k8 = tl.load(K8 + rows, mask=ok[:, None], other=0)
    tl.store(KB + rows, e4m3_to_bf16(k8), mask=ok[:, None])
    vt = tl.load(VT + bh * D * SK16 + d[:, None] * SK16 + j[None, :], mask=(j < SK16)[None, :], other=0)
    # slot 4 q + 2 h + c of each 16 holds key 8 h + 2 q + c: (q, h, c) -> (h, q, c), then keys-major
    v = tl.reshape(tl.permute(tl.reshape(vt, [D, BLOCK // 16, 4, 2, 2]), [0, 1, 3, 2, 4]), [D, BLOCK])
    v = tl.trans(v)
    tl.store(V8 + rows, v, mask=ok[:, None])


def backward_kv_operands(k8: torch.Tensor, vt_perm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(kb, v8)`` for the CuTe backward (module docstring).

    Args:
        k8: E4M3 (``torch.float8_e4m3fn``) ``[B, Hkv, Sk, D]``, contiguous.
        vt_perm: E4M3 ``[B, Hkv, D, Sk16]``, contiguous, Sk16 = Sk rounded up to 16 with the keys of
            each 16 in ``pv_layout.V_PERM16`` order (``quantize_fp8_v_transposed(v, perm16=True)``).
    Returns:
        kb: BF16 ``[B, Hkv, Sk, D]``, ``k8.to(torch.bfloat16)``; v8: E4M3 ``[B, Hkv, Sk, D]`` in key
        order. Both contiguous.
    Raises:
        ValueError: CPU tensors (outside the Triton interpreter), wrong dtypes, shapes or layouts, or
            a head dim that is not a power of two in 16..256.
    """
    b, h, sk, d = k8.shape
    sk16 = -(-sk // 16) * 16
    if not k8.is_cuda and not _interpreted():
        raise ValueError("backward_kv_operands: needs CUDA tensors (the CuTe backward runs on sm_90)")
    if (
        k8.dtype != torch.float8_e4m3fn
        or vt_perm.dtype != torch.float8_e4m3fn
        or tuple(vt_perm.shape) != (b, h, d, sk16)
        or not (k8.is_contiguous() and vt_perm.is_contiguous())
        or d & (d - 1)
        or not 16 <= d <= 256
    ):
        raise ValueError(
            f"backward_kv_operands: needs contiguous float8_e4m3fn k8 [B, Hkv, Sk, D] and vt_perm "
            f"[B, Hkv, D, Sk16] = {(b, h, d, sk16)} with D a power of two in 16..256; got "
            f"{k8.dtype} {tuple(k8.shape)} / {vt_perm.dtype} {tuple(vt_perm.shape)}"
        )
    kb = torch.empty((b, h, sk, d), dtype=torch.bfloat16, device=k8.device)
    v8 = torch.empty((b, h, sk, d), dtype=torch.uint8, device=k8.device)
    _bwd_kv_kernel[(triton.cdiv(sk, KV_BLOCK), b * h)](
        k8.view(torch.uint8), vt_perm.view(torch.uint8), kb, v8, sk, sk16, D=d, BLOCK=KV_BLOCK
    )
    return kb, v8.view(torch.float8_e4m3fn)
