"""The CuTe fp8 forward compiles for sm_90a without a GPU, with FP8 wgmma and no spills.

Needs nvidia-cutlass-dsl and flash-attn-4 (the ``cute`` extra, which scripts/bootstrap.sh installs,
so CI runs it); where they are missing these tests fail."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from cute_sass_report import compile_report  # sets the DSL dump options before cutlass loads


@pytest.mark.parametrize("tiles", [(128, 128, 2), (128, 96, 2)])
def test_default_kernel_qgmma_no_spills(tiles):
    rep = compile_report(tiles)
    n_k = 128 // 32  # head dim 128 in k32 steps (QK) and tile_n // 32 (PV)
    assert rep["QGMMA"] >= n_k + tiles[1] // 32, rep
    assert rep["HGMMA"] == 0, rep
    assert rep["inner_loops"] and rep["STL"] == 0 and rep["LDL"] == 0, rep
    assert rep["F2FP"] > 0 and rep["MUFU.EX2"] > 0, rep
    # a tile's K token scales (tile_n / 4 per thread) are loaded before its first wgmma, whose
    # latency hides theirs, unclamped inside the loops; only the first tile visited (peeled,
    # outside the loops) clamps its indices: without the clamp 9-10 integer min/max instructions
    # are left there (checked by removing it)
    assert all(
        loop["LDG_before_first_GMMA"] == loop["LDG"] == tiles[1] // 4 for loop in rep["inner_loops"]
    ), rep
    assert rep["int_minmax_outside_loops"] >= tiles[1] // 4, rep


def test_qk_promotion_per_64_drops_two_of_three_promotion_adds():
    """``qk_promote_k=64`` (a measurement option) chains two k32 products per partial sum (the second
    accumulates onto the first: 2 zero-initialized QK wgmmas per tile, not 4); of the three FP32
    additions of 64 accumulator registers per tile, one is left."""
    base = compile_report((128, 128, 2))["inner_loops"]
    per64 = compile_report((128, 128, 2), qk_promote_k=64)["inner_loops"]
    assert len(base) == len(per64) > 0
    for b, p in zip(base, per64):
        assert b["FADD"] - p["FADD"] == 2 * 64, (b, p)
        assert b["QGMMA"] == p["QGMMA"], (b, p)
        assert (b["QK_zero_init"], p["QK_zero_init"]) == (4, 2), (b, p)


def test_measurement_options_are_checked():
    from fp4_attention.backends.cute.fwd_sm90 import FP8ForwardSm90

    with pytest.raises(ValueError, match="qk_promote_k must be 32 or 64"):
        FP8ForwardSm90(128, 4, True, qk_promote_k=48)
    with pytest.raises(ValueError, match="qk_promote_k=64 needs promote_qk"):
        FP8ForwardSm90(128, 4, True, promote_qk=False, qk_promote_k=64)
    with pytest.raises(ValueError, match="promote_qk needs intra_wg_overlap=False"):
        FP8ForwardSm90(128, 4, True, intra_wg_overlap=True, promote_qk=True)


def test_kv_tile_schedule():
    """Per KV tile: the first two k32 QK products issue together, then each later one is waited for
    before its sum; the turn is handed on (BAR.ARV) after the first QK issue (FA4's ping-pong), and
    the PV product runs in the warpgroup's next turn."""
    rep = compile_report((128, 128, 2), causal=False)
    (loop,) = rep["inner_loops"]
    pv = "BAR.SYNC QGMMA QGMMA QGMMA QGMMA DEPBAR"
    assert loop["schedule"] == f"QGMMA BAR.ARV QGMMA DEPBAR QGMMA DEPBAR QGMMA DEPBAR {pv}", loop
    # the turns outside the loop balance: the sync before the loop and the peeled first tile's
    # sync (PV), the peeled tile's arrive (QK) and the arrive after the loop
    assert (rep["turn_sync_outside_loops"], rep["turn_arrive_outside_loops"]) == (2, 2), rep


@pytest.mark.parametrize(
    "group, head_dim, causal", [(4, 128, True), (4, 128, False), (4, 64, True), (1, 128, True)]
)
def test_backward_compiles_with_its_five_products(group, head_dim, causal):
    """The CuTe fp8 backward compiles for sm_90a. Per query block and warpgroup (the loop body appears
    twice: the first block peeled): S^T in k32 QGMMAs over the head dim, dP^T likewise, dV in k32
    QGMMAs over the 64 queries; dQ (128 keys) and dK (64 queries) in k16 HGMMAs; one exp2 per score."""
    from cute_sass_report import compile_bwd_report

    rep = compile_bwd_report(causal, group, head_dim)
    per_block_qgmma = 2 * (head_dim // 32) + 64 // 32
    assert rep["QGMMA"] == 2 * per_block_qgmma, rep
    assert rep["HGMMA"] == 2 * (128 // 16 + 64 // 16), rep
    assert rep["MUFU.EX2"] == 2 * 32, rep  # 64 keys x 64 queries per warpgroup / 128 threads
    if group > 1:  # the MHA epilogue (BF16 dK/dV through shared memory) spills a few registers today
        assert rep["STL"] == 0 and rep["LDL"] == 0, rep


@pytest.mark.parametrize("overlap, tiles", [(False, (128, 128, 2)), (True, (128, 96, 2))])
def test_nvfp4_kernel_bf16_qk_fp8_pv_no_spills(overlap, tiles):
    rep = compile_report(tiles, qk_bf16=True, intra_wg_overlap=overlap)
    assert rep["HGMMA"] >= 128 // 16, rep  # QK: BF16 wgmma, k16 steps over the head dim
    assert rep["QGMMA"] >= 128 // 32, rep  # PV: FP8 wgmma
    assert rep["STL"] == 0 and rep["LDL"] == 0, rep
