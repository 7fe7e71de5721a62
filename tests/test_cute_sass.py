"""The CuTe fp8 forward compiles for sm_90a without a GPU, with FP8 wgmma and no spills (issue 11).

Runs where nvidia-cutlass-dsl and flash-attn-4 are importable (the ``cute`` extra, which
scripts/bootstrap.sh installs, so CI runs it); skipped where they are missing."""

import sys
from pathlib import Path

import pytest

from .conftest import have_module

if not (have_module("cutlass") and have_module("flash_attn.cute")):
    pytest.skip("needs nvidia-cutlass-dsl and flash-attn-4 (the cute extra)", allow_module_level=True)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from cute_sass_report import compile_report  # sets the DSL dump options before cutlass loads


@pytest.mark.parametrize("tiles", [(128, 128, 2), (128, 96, 2)])
def test_default_kernel_qgmma_no_spills(tiles):
    rep = compile_report(tiles)
    n_k = 128 // 32  # head dim 128 in k32 steps (QK) and tile_n // 32 (PV)
    assert rep["QGMMA"] >= n_k + tiles[1] // 32, rep
    assert rep["HGMMA"] == 0, rep
    assert rep["STL"] == 0 and rep["LDL"] == 0, rep
    assert rep["F2FP"] > 0 and rep["MUFU.EX2"] > 0, rep
