"""bench/ncu_inst_mix.py on a small SASS page CSV of ncu's layout (plain and gzipped)."""

import gzip
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import ncu_inst_mix  # noqa: E402

HEADER = '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"'
ROWS = [
    '"0x10","      FMUL R1, R2, R3","5","1,000"',
    '"0x20","@P0 FMUL R4, R2, R3","1","500"',
    '"0x30","      MUFU.EX2 R5, R4","2","750"',
    '"0x40","@!UPT QGMMA.64x64x32.F32.E4M3.E4M3 R0, gdesc[UR4], R0","10","250"',
    '"0x50","      F2FP.BF16.F32.PACK_AB R6, R5, R4","0","250"',
]


def _write(path: Path, rows=ROWS, gz=False):
    text = '"Kernel Name","k",\n' + "\n".join([HEADER, *rows]) + "\n"
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return str(path)


def test_counts_by_opcode_without_modifiers_or_predicates(tmp_path):
    executed, stalls = ncu_inst_mix.instruction_mix(_write(tmp_path / "a.sass.csv"))
    assert executed == {"FMUL": 1500, "MUFU": 750, "QGMMA": 250, "F2FP": 250}
    assert stalls == {"FMUL": 6, "MUFU": 2, "QGMMA": 10, "F2FP": 0}


def test_report_in_units_of_an_opcode_and_gzip(tmp_path):
    a = _write(tmp_path / "a.sass.csv")
    b = _write(tmp_path / "b.sass.csv.gz", rows=ROWS[2:], gz=True)
    text = ncu_inst_mix.report([a, b], unit_op="MUFU")
    fmul = next(line for line in text.splitlines() if line.startswith("| FMUL |"))
    # file a: 1500 FMUL = 2.00 per MUFU, 54.5% of 2750; file b has none
    assert fmul.split(" | ")[1:5] == ["0.0", "54.5", "33.3", "2.00"]
    assert fmul.rstrip(" |").split(" | ")[-4:] == ["0.0", "0.0", "0.0", "0.00"]
    total = next(line for line in text.splitlines() if line.startswith("| (all) |"))
    assert total.split(" | ")[4] == "3.67"


def test_errors_name_the_problem(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text('"a","b"\n"1","2"\n')
    with pytest.raises(ValueError, match="not an ncu SASS page"):
        ncu_inst_mix.instruction_mix(str(bad))
    with pytest.raises(ValueError, match="executes no HGMMA"):
        ncu_inst_mix.report([_write(tmp_path / "a.sass.csv")], unit_op="HGMMA")
