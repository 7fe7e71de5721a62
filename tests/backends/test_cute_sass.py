"""The CuTe fp8 forward compiles for sm_90a without a GPU, with FP8 wgmma and no spills.

Needs nvidia-cutlass-dsl and flash-attn-4 (the ``cute`` extra, which scripts/bootstrap.sh installs,
so CI runs it); where they are missing these tests fail."""

import functools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from cute_sass_report import compile_bwd_report, compile_report  # sets the DSL dump options first

# each kernel compiled once per session: several tests read the same kernels (CI time)
_bwd_report = functools.cache(compile_bwd_report)
_fwd_report = functools.cache(compile_report)


@pytest.mark.parametrize(
    "tiles, causal",
    [((128, 128, 2), True), ((128, 96, 2), True), ((128, 192, 2), True), ((128, 192, 2), False)],
)  # the default tiles of D64 and D128, causal or not (cute.backend.default_tiles), and the tests' other tile
def test_default_kernel_qgmma_no_spills(tiles, causal):
    rep = _fwd_report(tiles, causal=causal)
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


@pytest.mark.parametrize("tiles, causal", [((128, 128, 2), True), ((128, 192, 2), False)])
def test_k_group_option_folds_the_group_scales(tiles, causal):
    """``k_group=64`` (one K scale per 64 keys, results/cute_k_group64_h200): per KV tile one scale
    load per group and no per-score multiply; at 128 keys the unmasked loop took 474 instructions
    against 557 (767 -> 651 at 192), and the kernel 6.5-8.7% less time on the H200."""
    base = _fwd_report(tiles, causal=causal)
    rep = _fwd_report(tiles, causal=causal, k_group=64)
    assert rep["STL"] == 0 and rep["LDL"] == 0 and rep["MUFU.EX2"] == base["MUFU.EX2"], rep
    for loop, base_loop in zip(rep["inner_loops"], base["inner_loops"], strict=True):
        assert loop["LDG"] == tiles[1] // 64, loop  # one scale per group (the per-token 32 or 48)
        assert loop["FMUL"] <= 4 * tiles[1] // 64, loop  # the factors, per row and group
        assert loop["instructions"] < base_loop["instructions"] - 60, (loop, base_loop)


def test_qk_product_is_one_chain_of_four_k32_wgmmas():
    """The QK product is not promoted (the recipe's definition): per KV tile one zero-initialized
    chain of head_dim / 32 QGMMAs (a promoted product starts one per partial sum)."""
    (loop,) = _fwd_report((128, 128, 2), causal=False)["inner_loops"]
    assert loop["QK_zero_init"] == 1, loop


def test_kv_tile_schedule():
    """Per KV tile: the four k32 QK products issued as one chain, the turn handed on (BAR.ARV) right
    after their issue (FA4's ping-pong), one wait; then the PV product in the warpgroup's next turn."""
    rep = _fwd_report((128, 128, 2), causal=False)
    (loop,) = rep["inner_loops"]
    pv = "BAR.SYNC QGMMA QGMMA QGMMA QGMMA DEPBAR"
    assert loop["schedule"] == f"QGMMA QGMMA QGMMA QGMMA BAR.ARV DEPBAR {pv}", loop
    # the turns outside the loop balance: the sync before the loop and the peeled first tile's
    # sync (PV), the peeled tile's arrive (QK) and the arrive after the loop
    assert (rep["turn_sync_outside_loops"], rep["turn_arrive_outside_loops"]) == (2, 2), rep


@pytest.mark.parametrize(
    "group, head_dim, causal, qk_bf16",
    [
        (4, 128, True, False),
        (4, 128, False, False),
        (4, 64, True, False),
        (1, 128, True, False),
        (4, 128, True, True),
    ],
)
def test_backward_compiles_with_its_five_products(group, head_dim, causal, qk_bf16):
    """The CuTe fp8 backward compiles for sm_90a. Per query block and warpgroup (the loop body appears
    twice: the first block peeled): S^T in k32 QGMMAs over the head dim, dP^T likewise, dV in k32
    QGMMAs over the 64 queries; dQ (128 keys) and dK (64 queries) in k16 HGMMAs; one exp2 per score.
    ``qk_bf16`` (nvfp4qk_fp8pv): S^T in k16 HGMMAs instead, the rest the same (566 instructions per
    trip at GQA 4, D128 causal, against 473 for E4M3 Q/K, whose one dS saves the rest)."""
    rep = _bwd_report(causal, group, head_dim, qk_bf16)
    s_qgmma, s_hgmma = (0, head_dim // 16) if qk_bf16 else (head_dim // 32, 0)
    per_block_qgmma = s_qgmma + head_dim // 32 + 64 // 32
    assert rep["QGMMA"] == 2 * per_block_qgmma, rep
    assert rep["HGMMA"] == 2 * (s_hgmma + 128 // 16 + 64 // 16), rep
    assert rep["MUFU.EX2"] == 2 * 32, rep  # 64 keys x 64 queries per warpgroup / 128 threads
    # S^T is one chain of head_dim / 32 QGMMAs (not promoted: the recipe's definition), dP^T the
    # other zero-initialized product with A from shared memory; the promoted S^T (5 here) took 685
    # instructions per loop trip at GQA 4, D128 causal, the unpromoted one 555 with two scaled dS
    # and 473 with the one dS of today's fp8 definition
    (loop,) = rep["inner_loops"]
    assert loop["QK_zero_init"] == 2, loop
    # the wgmmas are not serialized (S^T and dP^T issue together): 5 waits per trip for the 22 (18
    # at D64) products. With the promoted S^T, ptxas put a wait after every wgmma of the loop (22
    # waits, 685 instructions per trip at GQA 4, D128 causal); FA4's BF16 backward of that shape
    # takes 442 instructions
    assert loop["schedule"].count("DEPBAR") <= 5, loop["schedule"]
    # spills: the MHA epilogue (BF16 dK/dV through shared memory) spills a few registers; with the
    # unpromoted S^T and two scaled dS the GQA kernel at D128 stored 2-3 registers outside the loop
    # and reloaded 1-2 per trip (none at D64; qk_bf16 still does); fp8's one dS spills nothing
    assert loop["STL"] <= (1 if group == 1 else 0) and loop["LDL"] <= (6 if group == 1 else 2), loop
    if group > 1:
        assert rep["STL"] <= 3, rep


@pytest.mark.parametrize(
    "tiles, causal", [((128, 128, 2), True), ((128, 96, 2), True), ((128, 192, 2), False)]
)
def test_nvfp4_kernel_bf16_qk_fp8_pv_no_spills(tiles, causal):
    rep = _fwd_report(tiles, causal=causal, qk_bf16=True)
    assert rep["HGMMA"] >= 128 // 16, rep  # QK: BF16 wgmma, k16 steps over the head dim
    assert rep["QGMMA"] >= 128 // 32, rep  # PV: FP8 wgmma
    assert rep["STL"] == 0 and rep["LDL"] == 0, rep
    # the per-head K global scale is folded into the row factor (fwd_sm90.fold_k_scale): no K scale
    # loads and no per-score multiply in the KV loop. Before the fold, at 128 keys: 32 LDG and 66
    # FMUL per trip, 573 instructions in the unmasked loop (465 after); kernel only at B4 causal
    # 0.950 -> 0.854 ms on the H200 (results/cute_nvfp4_kscale_fold_h200)
    for loop in rep["inner_loops"]:
        assert loop["LDG"] == 0 and loop["FMUL"] <= 2, loop


@pytest.mark.parametrize("group", [4, 1])
def test_backward_fp8_one_ds(group):
    """The fp8 backward rounds one BF16 dS for dK and dQ (the token scales in the BF16 operands,
    ``reference_backward``'s fp8 definition); the qk_bf16 kernel scales two (its S^T reads the
    unscaled BF16 tiles). Per loop trip at D128 causal (32 scores per thread) the fp8 loop has two
    FMUL and half an F2FP per score fewer for dS, and one FMUL per score more for its K token scale,
    which qk_bf16 folds into its 16 per-query row factors instead (``fold_k_scale``): FMUL 112 -> 64,
    F2FP 48 -> 32, 566 -> 473 instructions at GQA 4 (the same softmax, products and exponentials
    otherwise), and no spill at all."""
    two = _bwd_report(True, group, 128, True)
    one = _bwd_report(True, group, 128, False)
    assert one["MUFU.EX2"] == two["MUFU.EX2"], (one, two)
    (loop,), (two_loop,) = one["inner_loops"], two["inner_loops"]
    # x * row and x * col2 per score (qk_bf16), t * col per score (fp8), the 16 folds (qk_bf16)
    assert loop["FMUL"] == two_loop["FMUL"] - 64 + 32 - 16, (loop, two_loop)
    assert loop["F2FP"] == two_loop["F2FP"] - 16, (loop, two_loop)  # one dS conversion (pairs)
    assert loop["instructions"] < two_loop["instructions"] - 60, (loop, two_loop)
    assert loop["STL"] == 0 and loop["LDL"] == 0 and one["STL"] == 0, (loop, one)


def test_backward_causal_ctas_heaviest_first_in_l2_sections():
    """A causal backward takes its CTAs through flash-attn-4's ``SingleTileLPTBwdScheduler`` (heaviest
    first within L2-sized sections of heads: ``bwd_sm90``'s module docstring has the H100's
    measurement against the grid order), a non-causal one in FA4's grid order (equal work per CTA)."""
    from flash_attn.cute.tile_scheduler import SingleTileLPTBwdScheduler, SingleTileScheduler

    from fp4_attention.backends.cute.bwd_sm90 import FP8BackwardSm90

    assert FP8BackwardSm90(128, 4, True).Scheduler is SingleTileLPTBwdScheduler
    assert FP8BackwardSm90(64, 1, False).Scheduler is SingleTileScheduler
