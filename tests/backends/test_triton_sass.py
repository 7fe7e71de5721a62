"""The Triton forward kernel compiled for sm_90 on the CPU (Triton ships ptxas and cuobjdump): the
FP8 products are FP8 tensor-core instructions (QGMMA) and the default tiles do not spill.

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
