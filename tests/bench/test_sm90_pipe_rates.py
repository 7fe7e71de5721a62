"""bench/sm90_pipe_rates.py's sequences compile (sm_90, on the CPU) to the instructions they are
named for, 64 per loop body (8 unrolled steps on 8 elements per thread), none folded away."""

import collections
import re
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import sass_report  # noqa: E402
import sm90_pipe_rates as rates  # noqa: E402

# the SASS opcodes each sequence must issue 64 times per loop body
EXPECTED = {
    "ffma": ("FFMA",),
    "ex2.f32": ("MUFU.EX2",),
    "ex2.f16x2": ("MUFU.EX2.F16",),  # two per packed step: one per half
    "ex2.bf16x2": ("MUFU.EX2.BF16",),
    "e4m3x2": ("F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C",),
    "ex2+e4m3x2": ("MUFU.EX2", "F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C"),
    "ex2+ffma": ("MUFU.EX2", "FFMA"),
    "ex2+ffma+fadd": ("MUFU.EX2", "FFMA", "FADD"),
    "bf16x2": ("F2FP.BF16.F32.PACK_AB",),
    "fmnmx": ("FMNMX",),
}


@pytest.mark.parametrize("name", list(rates.SEQUENCES))
def test_sequence_compiles_to_its_instructions(name):
    asm, cons, dt, pack, _ = rates.SEQUENCES[name]
    ptr = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}[dt]
    k = sass_report.compile_kernel(
        rates._rate_kernel,
        {"x_ptr": ptr, "out_ptr": ptr},
        {"ASM": asm, "CONSTRAINTS": cons, "PACK": pack, "BLOCK": 1024},
    )
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        sass, _ = sass_report.disassemble(f.name)
    ops = collections.Counter(
        re.sub(r"^@!?P\d\s+", "", line.split(";")[0].split("*/")[-1].strip()).split(" ")[0]
        for line in sass.splitlines()
        if re.match(r"\s*/\*[0-9a-f]{4}\*/", line)
    )
    for op in EXPECTED[name]:
        assert ops[op] == 64, (name, op, ops)
