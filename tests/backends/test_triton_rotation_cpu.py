"""The Triton side of the Q/K rotation without a GPU.

* Interpreted (``TRITON_INTERPRET=1``, in a subprocess: the variable is read when the kernels are
  defined): the rotating quantizer kernels give the same bytes as the same kernels fed the
  reference's FP32 rotation ``numerics.rotation.rotate`` (so the in-kernel butterfly is the
  reference's to the bit; the interpreter's FP8 conversion is not the hardware's, so bytes against
  ``numerics.quant`` are checked on the GPU: test_triton_rotation.py); the row amax and the
  un-rotation kernels equal the reference's FP32 values exactly.
* Compiled for sm_90 (Triton's ptxas, as test_triton_sass.py): the rotating kernels at head dim
  128 build and do not spill registers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _interpreted_checks() -> list[str]:
    """Run under TRITON_INTERPRET=1; returns the failed checks."""
    import torch
    import triton

    from fp4_attention.backends.triton import quant_fp8, quant_nvfp4
    from fp4_attention.backends.triton import rotation as tr
    from fp4_attention.numerics.quant import nvfp4_global_scale
    from fp4_attention.numerics.rotation import hadamard_signs, inv_sqrt_dim, rotate, unrotate

    failed = []
    for d in (64, 128):
        g = torch.Generator().manual_seed(d)
        # magnitudes spread within each row too, so that the FP32 sums round (stage order matters)
        x = torch.randn(2, 2, 40, d, generator=g) * torch.exp(torch.randn(2, 2, 40, d, generator=g) * 3)
        x[0, 0, 3] = 0.0  # zero row
        x[0, 1, 5, 7] = 100.0  # an outlier
        x[1, 1, 2, 3] = float("nan")
        x[1, 0, 9, 1] = float("inf")
        x = x.bfloat16()
        s = hadamard_signs(3, d)
        xr = rotate(x, s).contiguous()
        n, log2d = x.numel() // d, d.bit_length() - 1
        rot = dict(SIGNS=s, ROTATE=True, LOG2_D=log2d, INV_SQRT_D=inv_sqrt_dim(d))

        fp8 = []
        for inp, kw in ((x, rot), (xr, {})):
            y, sc = torch.empty(x.shape, dtype=torch.uint8), torch.empty((*x.shape[:-1], 1))
            quant_fp8._fp8_rows_kernel[(triton.cdiv(n, 16),)](
                inp, y, sc, n, *x.shape[1:3], *inp.stride()[:3], D=d, FMAX=448.0, E5M2=False, ROWS=16, **kw
            )
            fp8.append((y, sc.nan_to_num(), sc.isnan()))
        if not all(torch.equal(a, b) for a, b in zip(*fp8)):
            failed.append(f"fp8 rows d={d}")
        # the same rows read in place from [B, S, H, D] and [S, B, H, D] memory (no copy)
        for perm in ((0, 2, 1, 3), (2, 0, 1, 3)):
            inv = [perm.index(i) for i in range(4)]
            strided = x.permute(*perm).contiguous().permute(*inv)
            y, sc = torch.empty(x.shape, dtype=torch.uint8), torch.empty((*x.shape[:-1], 1))
            quant_fp8._fp8_rows_kernel[(triton.cdiv(n, 16),)](
                strided,
                y,
                sc,
                n,
                *x.shape[1:3],
                *strided.stride()[:3],
                D=d,
                FMAX=448.0,
                E5M2=False,
                ROWS=16,
                **rot,
            )
            if not torch.equal(y, fp8[0][0]) or not torch.equal(sc.nan_to_num(), fp8[0][1]):
                failed.append(f"fp8 rows d={d} read in place from layout {perm}")

        amax = torch.empty((*x.shape[:-1], 1))
        tr._row_amax_kernel[(triton.cdiv(n, 8),)](
            x, amax, n, D=d, ROWS=8, SIGNS=s, LOG2_D=log2d, INV_SQRT_D=inv_sqrt_dim(d)
        )
        g_k, g_ref = nvfp4_global_scale(amax, dims=(2, 3)), nvfp4_global_scale(xr, dims=(2, 3))
        finite = torch.isfinite(xr).all(-1, keepdim=True)
        if not (
            torch.equal(g_k.nan_to_num(), g_ref.nan_to_num())
            and torch.equal(g_k.isnan(), g_ref.isnan())
            and torch.equal(amax[finite], xr.abs().amax(-1, keepdim=True)[finite])
            and bool(amax[~finite].isnan().all())
        ):
            failed.append(f"row amax d={d}")

        gg = g_ref.expand(*x.shape[:-1], 1).contiguous()
        nv = []
        for inp, kw in ((x, rot), (xr, {})):
            payload = torch.empty((*x.shape[:-1], d // 2), dtype=torch.uint8)
            scales = torch.empty((*x.shape[:-1], d // 16), dtype=torch.uint8)
            dec = torch.empty(x.shape, dtype=torch.bfloat16)
            quant_nvfp4._nvfp4_rows_kernel[(triton.cdiv(x.shape[2], 8), x.shape[1], x.shape[0])](
                inp,
                gg,
                payload,
                scales,
                dec,
                *x.shape[1:3],
                *inp.stride()[:3],
                D=d,
                ROWS=8,
                FAST_DIV=False,
                **kw,
            )
            nv.append((payload, scales, dec.view(torch.int16)))
        if not all(torch.equal(a, b) for a, b in zip(*nv)):
            failed.append(f"nvfp4 rows d={d}")
        # the wrapper on [B, S, H, D] memory read in place: the contiguous call's bytes
        strided = x.transpose(1, 2).contiguous().transpose(1, 2)
        for signs in (None, s):
            a_nv, a_dec = quant_nvfp4.quantize_nvfp4_rows(x, g_ref, signs=signs)
            b_nv, b_dec = quant_nvfp4.quantize_nvfp4_rows(strided, g_ref, signs=signs)
            same = torch.equal(a_nv.payload, b_nv.payload) and torch.equal(a_nv.block_scale, b_nv.block_scale)
            if not (same and torch.equal(a_dec.view(torch.int16), b_dec.view(torch.int16))):
                failed.append(f"nvfp4 rows d={d} read in place (rotation {signs is not None})")

        grad = torch.randn(3, 5, d, generator=g) * torch.exp(torch.randn(3, 5, 1, generator=g) * 3)
        out = torch.empty(grad.shape)
        tr._unrotate_kernel[(triton.cdiv(15, 8),)](
            grad, out, 15, D=d, ROWS=8, SIGNS=s, LOG2_D=log2d, INV_SQRT_D=inv_sqrt_dim(d)
        )
        if not torch.equal(out, unrotate(grad, s)):
            failed.append(f"unrotate d={d}")
    return failed


def test_interpreted_kernels_rotate_as_the_reference():
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__)


def test_rotating_kernels_compile_for_sm90_without_spills():
    """The two quantizers that rotate in registers (the butterfly beside the scales and codes: the
    register-heavy kernels) compile for sm_90 without spills. The row-amax and un-rotation kernels,
    the butterfly alone, were checked the same way when written (no spills) and are left out to
    keep CI short (each compile takes about 13 s here)."""
    sys.path.insert(0, str(REPO / "bench"))
    from sass_report import compile_kernel, sass_stats

    from fp4_attention.backends.triton import quant_fp8, quant_nvfp4
    from fp4_attention.numerics.rotation import inv_sqrt_dim

    d = 128
    rot = dict(LOG2_D=7, INV_SQRT_D=inv_sqrt_dim(d))
    cases = {
        "fp8 rows": (
            quant_fp8._fp8_rows_kernel,
            {"X": "bf16", "Y": "u8", "S": "fp32", "SIGNS": "fp32"},
            dict(D=d, FMAX=448.0, E5M2=False, ROWS=2048 // d, ROTATE=True, **rot),
        ),
        "nvfp4 rows": (
            quant_nvfp4._nvfp4_rows_kernel,
            {"X": "bf16", "G": "fp32", "P": "u8", "SC": "u8", "DEC": "bf16", "SIGNS": "fp32"},
            dict(D=d, ROWS=1024 // d, ROTATE=True, HEAD_AMAX=False, **rot),
        ),
    }
    for name, (fn, ptrs, consts) in cases.items():
        try:
            st = sass_stats(compile_kernel(fn, ptrs, consts, num_warps=4))
        except (RuntimeError, FileNotFoundError, PermissionError) as exc:  # no runnable ptxas here
            pytest.skip(f"Triton cannot compile for sm_90 here: {exc}")
        assert st["STL"] == 0 and st["LDL"] == 0, (name, st)


if __name__ == "__main__":
    problems = _interpreted_checks()
    print("\n".join(problems) if problems else "ok")
    sys.exit(1 if problems else 0)
