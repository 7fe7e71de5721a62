"""The Triton kernels compiled for sm_90 on the CPU (Triton ships ptxas and cuobjdump): the FP8
products are FP8 tensor-core instructions (QGMMA) and the default tiles do not spill; the backward's
preparation kernels store whole vectors and do not spill.

No GPU is needed: ``bench/sass_report.py`` compiles with the specialisation of a real launch."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from sass_report import compile_forward, sass_stats  # noqa: E402

from fp4_attention.backends.triton import backend as triton_backend  # noqa: E402


def _stats(qk_fp8, pv_fp8, causal):
    block_m, warps, stages = triton_backend.default_fwd_tiles(128)
    try:
        kernel = compile_forward(
            qk_fp8=qk_fp8,
            pv_fp8=pv_fp8,
            causal=causal,
            block_m=block_m,
            block_n=triton_backend.default_block_n(128),
            num_warps=warps,
            num_stages=stages,
        )
    except (RuntimeError, FileNotFoundError, PermissionError) as exc:  # no runnable ptxas on this host
        pytest.skip(f"Triton cannot compile for sm_90 here: {exc}")
    return sass_stats(kernel)


@pytest.mark.parametrize("causal", [True, False])
def test_fp8_forward_runs_both_products_on_fp8_tensor_cores(causal):
    st = _stats(True, True, causal)
    # QK (D=128: 4 k-steps of 32) and PV (BLOCK_N=64: 2 k-steps) per tile, two loops (unmasked, masked)
    assert st["QGMMA"] >= 2 * 6 and st["HGMMA"] == 0, st
    assert st["STL"] == 0 and st["LDL"] == 0, f"register spills: {st}"
    assert st["LDGSTS"] > 0, f"K/V tiles are not loaded asynchronously (no software pipelining): {st}"


def test_nvfp4qk_fp8pv_forward_qk_bf16_emulation_pv_fp8():
    st = _stats(False, True, True)
    assert st["HGMMA"] > 0 and st["QGMMA"] > 0, st  # exact BF16 emulation of the NVFP4 QK; FP8 PV
    assert st["STL"] == 0, st


@pytest.mark.parametrize("kernel", ["_bwd_dkdv_kernel", "_bwd_dq_kernel"])
def test_fp8_backward_products_on_fp8_tensor_cores(kernel):
    """dV = P8^T dO8 and dP = dO8 V8^T (dK/dV kernel), dP (dQ kernel) are FP8 MMAs; dK and dQ are BF16
    MMAs of the BF16 dS (contract §1): both instruction kinds appear, at the backend's tiles."""
    from sass_report import compile_backward

    tiles = triton_backend.BWD_DKDV_TILES if kernel == "_bwd_dkdv_kernel" else triton_backend.BWD_DQ_TILES
    try:
        st = sass_stats(compile_backward(kernel, qk_fp8=True, pv_fp8=True, causal=True, tiles=tiles))
    except (RuntimeError, FileNotFoundError, PermissionError) as exc:
        pytest.skip(f"Triton cannot compile for sm_90 here: {exc}")
    assert st["QGMMA"] > 0 and st["HGMMA"] > 0, st


def _compile_or_skip(fn, ptrs, consts, **kw):
    from sass_report import compile_kernel

    try:
        return compile_kernel(fn, {k: v for k, v in ptrs.items() if k in fn.arg_names}, consts, **kw)
    except (RuntimeError, FileNotFoundError, PermissionError) as exc:  # no runnable ptxas on this host
        pytest.skip(f"Triton cannot compile for sm_90 here: {exc}")


@pytest.mark.parametrize("d", [64, 128])
def test_backward_preparation_kernels_store_whole_vectors_without_spills(d):
    """The dO preparation and the K/V operands of the CuTe backward are memory-bound: their
    transposed outputs (dO^T, V in key order) leave through vector stores after a register
    permutation, not a byte per element (64 byte stores and 242 spill stores per thread before)."""
    from fp4_attention.backends.triton import bwd_kv, dout_quant

    ptrs = dict(DO="bf16", O="bf16", VS="fp32", AMAX="fp32", BAD="i32", LSE="fp32", QS="fp32", Y="u8")
    ptrs.update(YT="u8", SDO="fp32", DELTA="fp32", STAT="fp32", R="fp32", ROW="fp32", Q8="u8", QB="bf16")
    kv_ptrs = dict(K8="u8", KSC="u8", VT="u8", KB="bf16", V8="u8", KS="fp32", COL="fp32", COL2="fp32")
    kernels = {}
    consts = dict(D=d, BLOCK=dout_quant.QUANT_BLOCK, LIFT=8, TRANSPOSED=True, Q_BF16=True)
    kernels["dO preparation"] = _compile_or_skip(
        dout_quant._dout_quant_kernel, ptrs, consts, num_warps=dout_quant.QUANT_WARPS
    )
    for nvfp4 in (False, True):  # K from E4M3 codes (scaled into kb) or NVFP4 (payload and block scales)
        consts = dict(D=d, BLOCK=bwd_kv.KV_BLOCK, K_NVFP4=nvfp4, WRITE_COL=nvfp4, COL2_SCALE=2.0**-8)
        kernels[f"K/V operands nvfp4={nvfp4}"] = _compile_or_skip(bwd_kv._bwd_kv_kernel, kv_ptrs, consts)
    for name, kernel in kernels.items():
        st = sass_stats(kernel)
        assert st["STL"] == 0 and st["LDL"] == 0, f"{name}: register spills: {st}"
        assert "st.global.b8" not in kernel.asm["ptx"], f"{name}: byte stores to global memory"


@pytest.mark.parametrize("d", [64, 128])
def test_quantizers_compile_for_any_strides_without_spills(d):
    """The quantizers that read the caller's [B, H, S, D] views in place (strides as runtime
    integers, not the contiguous specialisation), V's two passes, the NVFP4 per-head scale's amax
    pass and the NVFP4 decode compile for sm_90 without spills."""
    from fp4_attention.backends.triton import quant_common, quant_fp8, quant_nvfp4, quant_v

    rot = dict(SIGNS=None, ROTATE=False, LOG2_D=0, INV_SQRT_D=1.0)
    kernels = {
        "fp8 rows": _compile_or_skip(
            quant_fp8._fp8_rows_kernel,
            dict(X="bf16", Y="u8", S="fp32"),
            dict(D=d, FMAX=448.0, E5M2=False, ROWS=2048 // d, BLOCKS=2, **rot),
        ),
        "nvfp4 rows": _compile_or_skip(
            quant_nvfp4._nvfp4_rows_kernel,
            dict(X="bf16", G="fp32", P="u8", SC="u8", DEC="bf16"),
            dict(D=d, ROWS=1024 // d, HEAD_AMAX=False, **rot),
        ),
        "nvfp4 rows, per-head scale": _compile_or_skip(
            quant_nvfp4._nvfp4_rows_kernel,
            dict(X="bf16", G="fp32", P="u8", SC="u8", DEC="bf16", BADH="i32", GOUT="fp32", TOK="fp32"),
            dict(D=d, ROWS=2048 // d, HEAD_AMAX=True, BLOCKS=2, **rot),
        ),
        "head amax": _compile_or_skip(
            quant_common._head_amax_kernel,
            dict(X="bf16", AMAX="fp32", BAD="i32"),
            dict(D=d, BLOCK_S=64, CHANNEL_SCALED=False),
        ),
        "nvfp4 decode": _compile_or_skip(
            quant_nvfp4._nvfp4_decode_kernel, dict(P="u8", SC="u8", OUT="bf16"), dict(D=d, ROWS=2048 // d)
        ),
        "V amax": _compile_or_skip(
            quant_v._v_amax_kernel, dict(X="bf16", AMAX="fp32", BAD="i32"), dict(D=d, BLOCK_S=64, ROWS=1024)
        ),
        "dO amax (head amax of dO times V's channel scales)": _compile_or_skip(
            quant_common._head_amax_kernel,
            dict(X="bf16", VS="fp32", AMAX="fp32", BAD="i32"),
            dict(D=d, BLOCK_S=64, CHANNEL_SCALED=True),
        ),
    }
    for perm16 in (False, True):
        kernels[f"V transposed perm16={perm16}"] = _compile_or_skip(
            quant_v._fp8_v_t_kernel,
            dict(X="bf16", AMAX="fp32", BAD="i32", SC="fp32", Y="u8"),
            dict(D=d, FMAX=448.0, BLOCK_S=64, PERM16=perm16),
        )
    for name, kernel in kernels.items():
        st = sass_stats(kernel)
        assert st["STL"] == 0 and st["LDL"] == 0, f"{name}: register spills: {st}"


@pytest.mark.parametrize("d", [64, 128])
def test_rope_kernels_compile_without_spills_and_without_fused_multiply_adds(d):
    """The RoPE kernels (``rope.py``) compiled as they launch, FP contraction off: no spills, and the
    standalone RoPE (no division, whose IEEE path has FFMAs of its own) has no FFMA at all, so each
    product is rounded before the sum as in the reference (``numerics/rope.py``)."""
    from sass_report import _compile

    from fp4_attention.backends.triton import rope

    def compile_rope(fn, ptrs, consts):
        try:
            return _compile(
                fn, ptrs, consts, 4, 1, plain_ints=("H", "H2", "n_programs"), enable_fp_fusion=False
            )
        except (RuntimeError, FileNotFoundError, PermissionError) as exc:  # no runnable ptxas on this host
            pytest.skip(f"Triton cannot compile for sm_90 here: {exc}")

    tables = dict(COS="fp32", SIN="fp32")
    for grad in (False, True):
        st = sass_stats(
            compile_rope(
                rope._rope_kernel,
                dict(X="bf16", Y="bf16", **tables, X2="bf16", Y2="bf16", COS2="fp32", SIN2="fp32"),
                dict(D=d, ROWS=16, HEADS=4, GRAD=grad, BY_BITS=False),
            )
        )
        assert st["STL"] == 0 and st["LDL"] == 0 and st["FFMA"] == 0 and st["FMUL"] > 0, (grad, st)
    pair = compile_rope(
        rope._fp8_rope_pair_kernel,
        dict(X="bf16", Y="u8", S="fp32", X2="bf16", Y2="u8", S2="fp32", **tables, COS2="fp32", SIN2="fp32"),
        dict(D=d, FMAX=448.0, E5M2=False, ROWS=16, HEADS=4, BY_BITS=False),
    )
    st = sass_stats(pair)
    assert st["STL"] == 0 and st["LDL"] == 0, st
    nvfp4 = {
        "head amax": compile_rope(
            rope._head_amax_rope_kernel,
            dict(X="bf16", AMAX="fp32", BAD="i32", **tables),
            dict(D=d, ROWS=64, HEADS=4, BY_BITS=False),
        ),
        "rows": compile_rope(
            rope._nvfp4_rope_rows_kernel,
            dict(
                X="bf16",
                AMAX="fp32",
                BADH="i32",
                P="u8",
                SC="u8",
                DEC="bf16",
                GOUT="fp32",
                TOK="fp32",
                **tables,
            ),
            dict(D=d, ROWS=2048 // d, HEADS=4, FAST_DIV=True, BY_BITS=False),
        ),
    }
    for name, kernel in nvfp4.items():
        st = sass_stats(kernel)
        assert st["STL"] == 0 and st["LDL"] == 0, (name, st)
