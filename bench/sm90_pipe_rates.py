"""Throughput of the instructions of the attention softmax on this GPU, relative to FFMA.

    python3 bench/sm90_pipe_rates.py [--iters 512] [--out results/.../pipe_rates]

Why: the CuTe fp8 forward's softmax (per thread and 128-key tile: 64 FMUL, 68 FMNMX, 64 FFMA, 66
MUFU.EX2, 32 F2FP E4M3 packs, 64 FADD) takes about twice its issue count in cycles
(results/cute_fwd_scale_first_h200), and which pipe bounds it decides what to change: the CUDA
guide gives 16 exponentials per clock per SM on sm_90 and 16 conversions, without saying whether
the E4M3 pack shares the exponential's pipe or whether the packed half-precision exponentials
(``ex2.approx.f16x2``, ``.bf16x2``) give two results per instruction.

Each kernel runs one PTX sequence (inline assembly, so that nothing is folded) in a loop over 8
independent chains per thread (a 1024-element block on 4 warps), at full occupancy, and reports
elements per clock per SM, with the clock taken from FFMA's rate (128 per clock per SM on sm_90:
the CUDA guide's table), so that the numbers do not depend on the clock the GPU ran at. A row whose
sequence has two instructions of different pipes reads near the slower one's rate if they overlap,
near the sum of their times if they share a pipe.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FFMA_PER_CLOCK_SM = 128  # CUDA C++ Programming Guide, arithmetic instructions table, compute capability 9.0

# name: (PTX of one step, constraint string, element dtype, elements per asm operand, instructions per step)
SEQUENCES = {
    "ffma": ("fma.rn.f32 $0, $1, 0f3F7FF000, 0f3A800000;", "=f,f", "f32", 1, "FFMA"),
    "ex2.f32": ("ex2.approx.ftz.f32 $0, $1;", "=f,f", "f32", 1, "MUFU.EX2"),
    "ex2.f16x2": ("ex2.approx.f16x2 $0, $1;", "=r,r", "f16", 2, "MUFU.EX2 (f16x2)"),
    "ex2.bf16x2": ("ex2.approx.ftz.bf16x2 $0, $1;", "=r,r", "bf16", 2, "MUFU.EX2 (bf16x2)"),
    "e4m3x2": (
        "{.reg .b16 h; cvt.rn.satfinite.e4m3x2.f32 h, $1, $1; mov.b32 $0, {h, h};}",
        "=f,f",
        "f32",
        1,
        "F2FP E4M3 pack (+ a register move)",
    ),
    "ex2+e4m3x2": (
        "{.reg .f32 e; .reg .b16 h; ex2.approx.ftz.f32 e, $1; cvt.rn.satfinite.e4m3x2.f32 h, e, e;"
        " mov.b32 $0, {h, h};}",
        "=f,f",
        "f32",
        1,
        "MUFU.EX2 then F2FP E4M3 pack",
    ),
    "ex2+ffma": (
        "{.reg .f32 e; ex2.approx.ftz.f32 e, $1; fma.rn.f32 $0, e, 0f3F7FF000, 0f3A800000;}",
        "=f,f",
        "f32",
        1,
        "MUFU.EX2 then FFMA",
    ),
    "ex2+ffma+fadd": (
        "{.reg .f32 e, f; fma.rn.f32 f, $1, 0f3F7FF000, 0fBF800000; ex2.approx.ftz.f32 e, f;"
        " add.f32 $0, e, f;}",
        "=f,f",
        "f32",
        1,
        "the softmax's FFMA, MUFU.EX2, FADD per element",
    ),
    "bf16x2": (
        "{.reg .b32 h; cvt.rn.bf16x2.f32 h, $1, $1; mov.b32 $0, h;}",
        "=f,f",
        "f32",
        1,
        "F2FP BF16 pack (the backward's dS)",
    ),
    "fmnmx": ("max.f32 $0, $1, 0f3F000000;", "=f,f", "f32", 1, "FMNMX (max with a constant)"),
}

_DTYPES = {
    "f32": (torch.float32, tl.float32),
    "f16": (torch.float16, tl.float16),
    "bf16": (torch.bfloat16, tl.bfloat16),
}


@triton.jit
def _rate_kernel(
    x_ptr,
    out_ptr,
    iters,
    ASM: tl.constexpr,
    CONSTRAINTS: tl.constexpr,
    PACK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    for _ in range(iters):
        for _u in tl.static_range(8):  # unrolled: the loop's own instructions are 1/8 as many
            x = tl.inline_asm_elementwise(ASM, CONSTRAINTS, [x], dtype=x.dtype, is_pure=True, pack=PACK)
    tl.store(out_ptr + offs, x)


def measure(name: str, iters: int, programs_per_sm: int = 16, reps: int = 5) -> dict:
    """Elements per second of one sequence (``SEQUENCES[name]``) at full occupancy, best of ``reps``."""
    asm, cons, dt, pack, what = SEQUENCES[name]
    torch_dt, _ = _DTYPES[dt]
    block = 1024
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = sms * programs_per_sm
    x = (torch.rand(grid * block, device="cuda") * 0.5 - 1.0).to(torch_dt)
    out = torch.empty_like(x)
    launch = lambda: _rate_kernel[(grid,)](x, out, iters, asm, cons, pack, block, num_warps=4)  # noqa: E731
    launch()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3)
    steps = grid * block * iters * 8  # one asm step per element, 8 per iteration
    return {
        "name": name,
        "what": what,
        "seconds": best,
        "steps": steps,
        "steps_per_s_per_sm": steps / best / sms,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=128, help="loop iterations of 8 steps each")
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    rows = [measure(n, args.iters) for n in SEQUENCES]
    clock = rows[0]["steps_per_s_per_sm"] / FFMA_PER_CLOCK_SM  # Hz implied by FFMA's rate
    for r in rows:
        r["per_clock_per_sm"] = r["steps_per_s_per_sm"] / clock
        r["elements_per_clock_per_sm"] = r["per_clock_per_sm"] * SEQUENCES[r["name"]][3]
    meta = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "implied_sm_clock_mhz": clock / 1e6,
        "iters": args.iters,
    }
    lines = [
        "# Instruction rates on " + meta["gpu"],
        "",
        f"`python3 bench/sm90_pipe_rates.py --iters {args.iters}`; the clock implied by FFMA's 128 per "
        f"clock per SM: {meta['implied_sm_clock_mhz']:.0f} MHz. Steps per clock per SM (a step is the "
        "sequence applied to one operand; packed sequences give two elements per step).",
        "",
        "| sequence | what | steps / clock / SM | elements / clock / SM |",
        "|---|---|---|---|",
    ]
    for r in rows:
        rate, elems = r["per_clock_per_sm"], r["elements_per_clock_per_sm"]
        lines.append(f"| `{r['name']}` | {r['what']} | {rate:.2f} | {elems:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        args.out.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
