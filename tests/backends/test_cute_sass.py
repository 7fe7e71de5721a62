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
    # by default a tile's K token scales are loaded after its QK product (the kernel run on the H200)
    assert all(
        loop["LDG_before_first_GMMA"] == 0 and loop["LDG"] == tiles[1] // 4 for loop in rep["inner_loops"]
    ), rep


@pytest.mark.parametrize("tiles", [(128, 128, 2), (128, 96, 2)])
def test_early_k_scales_load_before_the_qk_product_and_drop_the_clamps(tiles):
    """``early_k_scales``: the loads precede the tile's first wgmma, whose latency hides theirs, and
    only the first tile clamps its indices: fewer instructions per tile, the same FP arithmetic."""
    base = compile_report(tiles)
    early = compile_report(tiles, early_k_scales=True)
    assert early["STL"] == 0 and early["LDL"] == 0, early
    assert base["inner_loops"] and early["inner_loops"], (base, early)
    # the first tile visited (peeled, outside the loops) still clamps its 32 (tile_n / 4) indices:
    # without the clamp 9-10 integer min/max instructions are left there (checked by removing it)
    assert early["int_minmax_outside_loops"] >= tiles[1] // 4, early
    for b, e in zip(base["inner_loops"], early["inner_loops"], strict=True):
        assert e["LDG_before_first_GMMA"] == e["LDG"] == tiles[1] // 4, e
        assert e["instructions"] < b["instructions"], (b, e)
        assert all(e[op] == b[op] for op in ("FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "F2FP", "QGMMA")), (
            b,
            e,
        )


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
    with pytest.raises(ValueError, match="qk_pair_issue and qk_promote_k=64 need promote_qk"):
        FP8ForwardSm90(128, 4, True, promote_qk=False, qk_pair_issue=True)
    with pytest.raises(ValueError, match="early_k_scales is an option of the ping-pong"):
        FP8ForwardSm90(128, 4, True, intra_wg_overlap=True, promote_qk=False, early_k_scales=True)
    with pytest.raises(ValueError, match="exp2_fma_every must be an int >= 0"):
        FP8ForwardSm90(128, 4, True, exp2_fma_every=-1)
    with pytest.raises(ValueError, match="pv_only_turn is an option of the ping-pong"):
        FP8ForwardSm90(128, 4, True, intra_wg_overlap=True, promote_qk=False, pv_only_turn=True)


@pytest.mark.parametrize("qk_pair_issue", [False, True])
@pytest.mark.parametrize("pv_only_turn", [False, True])
def test_kv_tile_schedule(qk_pair_issue, pv_only_turn):
    """Per KV tile: the k32 QK products, each waited for before its sum (``qk_pair_issue``: the
    first two issue together), then the PV product in the warpgroup's turn. By default (FA4's
    ping-pong) the turn is handed on (BAR.ARV) after the next tile's first QK issue; with
    ``pv_only_turn`` right after the PV issue, before its wait."""
    first = "QGMMA QGMMA DEPBAR" if qk_pair_issue else "QGMMA DEPBAR QGMMA DEPBAR"
    if not pv_only_turn:
        first = first.replace("QGMMA", "QGMMA BAR.ARV", 1)
    pv = "BAR.SYNC QGMMA QGMMA QGMMA QGMMA " + ("BAR.ARV DEPBAR" if pv_only_turn else "DEPBAR")
    rep = compile_report((128, 128, 2), causal=False, pv_only_turn=pv_only_turn, qk_pair_issue=qk_pair_issue)
    (loop,) = rep["inner_loops"]
    assert loop["schedule"] == f"{first} QGMMA DEPBAR QGMMA DEPBAR {pv}", loop
    # and the turns outside the loop balance: by default the sync before the loop, and the peeled
    # first tile's sync (PV) and arrive (QK), the arrive after the loop; with pv_only_turn the peeled
    # tile's one sync and arrive around its PV issue
    n = 1 if pv_only_turn else 2
    assert (rep["turn_sync_outside_loops"], rep["turn_arrive_outside_loops"]) == (n, n), rep


def _run_ptx(ptx: str, x: float) -> float:
    """Interpret the few PTX instructions of the kernel's FMA-path exp2 on float32 values (round-down
    add via float64, FMA via float64: exact product, one double rounding as direct_p_e4m3._fma32)."""
    import math
    import struct

    import numpy as np

    def f32(v: float) -> float:
        return struct.unpack("<f", struct.pack("<f", v))[0]

    def bits(v: float) -> int:
        return struct.unpack("<I", struct.pack("<f", v))[0]

    def val(tok: str) -> float:  # a register or a 0fXXXXXXXX immediate
        return struct.unpack(">f", bytes.fromhex(tok[2:]))[0] if tok.startswith("0f") else reg[tok]

    reg = {"$1": f32(x)}

    for line in ptx.strip("{}\n").splitlines():
        if line.startswith(".reg"):
            continue
        op, args = line.rstrip(";").split(" ", 1)
        d, *src = [a.strip() for a in args.split(",")]
        if op == "max.f32":  # PTX max returns the other operand when one is NaN
            a, b = val(src[0]), val(src[1])
            reg[d] = b if math.isnan(a) else a if math.isnan(b) else max(a, b)
        elif op == "add.rm.f32":
            exact = val(src[0]) + val(src[1])  # exact in float64
            r = f32(exact)  # nearest float32; one float32 step down if that rounded up
            reg[d] = r if r <= exact else float(np.nextafter(np.float32(r), np.float32(-np.inf)))
        elif op == "sub.f32":
            reg[d] = f32(val(src[0]) - val(src[1]))
        elif op == "fma.rn.f32":
            reg[d] = f32(val(src[0]) * val(src[1]) + val(src[2]))
        elif op == "mov.b32":
            reg[d] = (
                bits(reg[src[0]])
                if isinstance(reg[src[0]], float)
                else struct.unpack("<f", struct.pack("<I", reg[src[0]]))[0]
            )
        elif op == "shl.b32":
            reg[d] = (reg[src[0]] << int(src[1])) & 0xFFFFFFFF
        elif op == "add.s32":
            reg[d] = (reg[src[0]] + reg[src[1]]) & 0xFFFFFFFF
        else:
            raise AssertionError(f"unexpected PTX {line!r}")
    return reg["$0"]


def test_exp2_fma_ptx_computes_the_direct_p_numerics():
    """The kernel's inline PTX for Direct-P (``exp2_fma_every``) computes ``direct_p_e4m3.exp2_fma``:
    interpreted here instruction by instruction on x in [-130, log2 448], bit for bit."""
    import math

    import torch

    from fp4_attention.backends.cute.fwd_sm90 import EXP2_FMA_DEGREE, _exp2_fma_ptx
    from fp4_attention.numerics.direct_p_e4m3 import exp2_fma

    ptx = _exp2_fma_ptx(EXP2_FMA_DEGREE)
    xs = torch.cat(
        [
            torch.linspace(-130.0, math.log2(448.0), 4001),
            torch.tensor([0.0, -1e-9, 8.0, -126.0, -torch.inf, torch.nan]),
        ]
    )
    want = exp2_fma(xs.float(), EXP2_FMA_DEGREE)
    got = torch.tensor([_run_ptx(ptx, float(x)) for x in xs.float()])
    assert torch.equal(got, want)
    assert want[-1] == want[-2] == 2.0**-126  # NaN and -inf: 2^-126, which E4M3 rounds to 0


def test_direct_p_columns_leave_the_exp2_unit():
    """``exp2_fma_every=4``: a quarter of the 64 exponentials per thread and tile leave MUFU.EX2 for
    FFMAs (the degree-4 Horner), in the same loop; no spills."""
    (base,) = compile_report((128, 128, 2), causal=False)["inner_loops"]
    rep = compile_report((128, 128, 2), causal=False, exp2_fma_every=4)
    (loop,) = rep["inner_loops"]
    assert rep["STL"] == 0 and rep["LDL"] == 0, rep
    assert base["MUFU"] - loop["MUFU"] == 16, (base, loop)
    assert loop["FFMA"] - base["FFMA"] == 16 * 4, (base, loop)


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


def test_backward_dk_fp8_option_moves_dk_to_qgmma():
    """``dk_fp8`` (a measurement option): the dK product becomes k32 QGMMAs over the 64 queries (2 per
    block and warpgroup, twice: the peeled first block), leaving dQ's k16 HGMMAs; GQA stays almost
    spill-free."""
    from cute_sass_report import compile_bwd_report

    base = compile_bwd_report(True, 4, 128)
    fp8 = compile_bwd_report(True, 4, 128, dk_fp8=True)
    assert fp8["QGMMA"] - base["QGMMA"] == 2 * (64 // 32), (base, fp8)
    assert base["HGMMA"] - fp8["HGMMA"] == 2 * (64 // 16), (base, fp8)
    assert fp8["STL"] <= 4, fp8


@pytest.mark.parametrize("overlap, tiles", [(False, (128, 128, 2)), (True, (128, 96, 2))])
def test_nvfp4_kernel_bf16_qk_fp8_pv_no_spills(overlap, tiles):
    rep = compile_report(tiles, qk_bf16=True, intra_wg_overlap=overlap)
    assert rep["HGMMA"] >= 128 // 16, rep  # QK: BF16 wgmma, k16 steps over the head dim
    assert rep["QGMMA"] >= 128 // 32, rep  # PV: FP8 wgmma
    assert rep["STL"] == 0 and rep["LDL"] == 0, rep
