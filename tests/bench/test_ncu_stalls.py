"""bench/ncu_stalls.py on a small SASS page CSV of ncu's layout."""

import gzip
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import ncu_stalls  # noqa: E402

HEADER = (
    '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
    '"stall_barrier","stall_long_sb","stall_wait","stall_barrier (Not Issued)","L1 Wavefronts Shared"'
)
# a prologue executed once per CTA (100 instructions) and a loop executed 1,000 times (100 + 1
# instruction of one warpgroup's branch, executed half as often)
ROWS = [f'"0x{i:x}","      MOV R{i}, R0","1","10","0","1","0","0","0"' for i in range(100)]
ROWS += [f'"0x{1000 + i:x}","      FFMA R{i}, R1, R2, R3","1","1,000","0","0","1","0","0"' for i in range(99)]
ROWS += [
    '"0x2000","      FENCE.VIEW.ASYNC.S","50","1,000","0","50","0","9","0"',
    '"0x2010","      STS.128 [R1], R4","30","500","30","0","0","0","2,000"',
    '"0x2020","@P0 HGMMA.64x64x16.F32.BF16 R0, gdesc[UR4], R0","0","1,000","0","0","0","0","8,000"',
    '"0x2030","      HGMMA.64x64x16.F32.BF16 R0, gdesc[UR8], R0, gsb0","0","1,000","0","0","0","0","8,000"',
]


def _write(path: Path) -> str:
    with gzip.open(path, "wt") as f:
        f.write('"Kernel Name","k",\n' + "\n".join([HEADER, *ROWS]) + "\n")
    return str(path)


def test_loop_found_by_execution_count_and_shares(tmp_path):
    text = ncu_stalls.report(_write(tmp_path / "a.sass.csv.gz"), top=2, min_share=0.1, loop_exe=None)
    # 100 + 99 + 50 + 30 = 279 samples; by reason: long_sb 150, wait 99, barrier 30 (not-issued
    # columns are not reasons of their own)
    assert "279 stall samples" in text
    assert "long_sb 53.8%, wait 35.5%, barrier 10.8%" in text
    # the loop: the largest count held by >= 100 instructions (1,000) and its half (the branch)
    assert "main loop (executed 1000 or 500 times): 64.2% of the samples" in text
    loop_lines = text.split("(loop only):")[1].split("top 2")[0].strip().splitlines()
    assert [line.split()[1:3] for line in loop_lines] == [["17.9%", "long_sb"], ["10.8%", "barrier"]]


def test_shared_traffic_by_opcode_and_shape(tmp_path):
    by_op = ncu_stalls.shared_by_opcode(_write(tmp_path / "a.sass.csv.gz"))
    # wgmma keep their shape (predicate and accumulator modifiers dropped), the rest their mnemonic
    assert by_op == {"HGMMA.64x64x16": 16000, "STS": 2000}


def test_not_a_sass_page(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text('"a","b"\n"1","2"\n')
    with pytest.raises(ValueError, match="not an ncu SASS page"):
        ncu_stalls.load(str(bad))


FWD_PROFILE = Path(__file__).resolve().parents[2] / (
    "results/cute_fwd_scale_first_h200/ncu_fp8_fwd_B4_causal_1fbd2d0.sass.csv.gz"
)


def test_forward_loop_regions_on_the_committed_profile():
    """The fp8 forward's KV-tile loop (the committed B4 causal profile) split at its anchors: every
    loop sample in one region, the two wgmma waits one instruction each (8,040 and 10,664 samples
    in the listing), the exponential region the largest."""
    regions = dict(ncu_stalls.loop_regions(str(FWD_PROFILE)))
    assert list(regions) == list(ncu_stalls.FWD_REGIONS)
    loop = [x for x in ncu_stalls.load(str(FWD_PROFILE)) if x[2] == 507904]
    assert sum(regions.values()) == sum(x[1] for x in loop)
    assert (regions["QK wait"], regions["PV wait"]) == (8040, 10664)
    assert max(regions, key=regions.get) == "exp, row sum, E4M3 pack"


def test_loop_regions_refuses_another_loop(tmp_path):
    with pytest.raises(ValueError, match="not the fp8 forward's loop"):
        ncu_stalls.loop_regions(_write(tmp_path / "a.sass.csv.gz"))
