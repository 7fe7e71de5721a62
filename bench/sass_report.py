"""Compile the Triton forward kernel for sm_90 on any machine (no GPU needed) and report its SASS.

    python bench/sass_report.py [--block-m M --block-n N --num-warps W --num-stages S]  # default tiles
    python bench/sass_report.py --backward          # the dK/dV and dQ kernels at the backend's tiles
    python bench/sass_report.py --quant nvfp4       # a quantizer kernel (rows, nvfp4, v_amax, v_codes,
                                                    # rows_pair, rope_pair, rope_nvfp4: with RoPE)
                                                    # (SASS_NVFP4_ROWS: nvfp4's rows per program, 16;
                                                    # --quant-blocks 1|2|4: the row kernels' blocks)

For each recipe's instantiation (QK FP8 or BF16, PV FP8 or BF16, causal or not) it prints the
register count, spills (STL/LDL), dynamic shared memory, and counts of the instructions that decide
speed: QGMMA (FP8 wgmma), HGMMA (BF16 wgmma), LDGSTS (cp.async), UTMALDG (TMA), MUFU.EX2, F2FP
(FP32 -> FP8/BF16 conversions). The arguments are specialised as a real launch on contiguous
[B, H, S, D] tensors would be (stride-1 dims constant, pointers and other strides 16-divisible,
S = 4096), so the code is the code the GPU runs. Uses the ptxas and cuobjdump that ship with Triton.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fp4_attention.backends.triton import kernels as K  # noqa: E402

INSTRUCTIONS = ("QGMMA", "HGMMA", "LDGSTS", "UTMALDG", "MUFU.EX2", "F2FP", "FFMA ", "FMUL ", "STL", "LDL")
UNIT_STRIDES = ("sqd", "skd", "svn", "srm", "scn", "svsd", "sod", "slm")


def _compile(fn, ptrs: dict, consts: dict, num_warps: int, num_stages: int, plain_ints=("GROUP",), **options):
    """Compile ``fn`` for sm_90 as a launch would specialise it: ``consts`` as constexprs (a constexpr
    parameter not given takes its default), pointers
    (element types in ``ptrs``) and integers 16-divisible (those in ``plain_ints`` excepted), softmax
    scales FP32; ``options``: further compile options (``enable_fp_fusion``)."""
    names = fn.arg_names
    # a constexpr parameter left out takes its default, as at a launch
    consts = {
        **{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default and p.name not in consts},
        **consts,
    }
    sig, attrs = {}, {}
    for i, n in enumerate(names):
        if n in consts:
            sig[n] = "constexpr"
        elif n in ptrs:
            sig[n], attrs[(i,)] = "*" + ptrs[n], [["tt.divisibility", 16]]
        elif n in ("qk_scale_log2", "sm_scale"):
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
            if n not in plain_ints:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(
        fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs
    )
    return triton.compile(
        src,
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=num_warps, num_stages=num_stages, **options),
    )


def compile_kernel(fn, ptrs: dict, consts: dict, *, num_warps: int = 4, num_stages: int = 1):
    """``triton.compile`` of any of our kernels for sm_90 (launch-like specialisation, see
    ``_compile``): ``ptrs`` maps pointer arguments to element types, ``consts`` the constexprs."""
    return _compile(fn, ptrs, consts, num_warps, num_stages)


def compile_forward(
    *,
    qk_fp8: bool,
    pv_fp8: bool,
    causal: bool,
    block_m: int,
    block_n: int,
    head_dim: int = 128,
    num_warps: int = 8,
    num_stages: int = 3,
    split: bool = True,
    imprecise: int | None = None,
):
    """``triton.compile`` of ``_fwd_kernel`` for sm_90 with launch-like specialisation."""
    ptrs = {
        "Q": "fp8e4nv" if qk_fp8 else "bf16",
        "K": "fp8e4nv" if qk_fp8 else "bf16",
        "V": "fp8e4nv" if pv_fp8 else "bf16",
        "ROW": "fp32",
        "COL": "fp32",
        "VSCALE": "fp32",
        "O": "bf16",
        "LSE": "fp32",
    }
    consts = dict(
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        CAUSAL=causal,
        QK_FP8=qk_fp8,
        PV_FP8=pv_fp8,
        LIFT=8,
        IMPRECISE=imprecise if qk_fp8 else None,
        DIRECT_P=False,
        DP_A=1.5,
        DP_B=1.2,
        DP_EXACT_EVERY=0,
        SPLIT=split,
    )
    if not qk_fp8:  # per-head scales are stride-0 expanded views
        consts.update(srm=0, scn=0)
    for n in UNIT_STRIDES:
        consts.setdefault(n, 1)
    return _compile(K._fwd_kernel, ptrs, consts, num_warps, num_stages)


BWD_UNIT_STRIDES = ("sqd", "skd", "svd", "srm", "scn", "sdod", "stm", "svsd", "sdkd", "sdqd")


def compile_backward(
    kernel_name: str,
    *,
    qk_fp8: bool,
    pv_fp8: bool,
    causal: bool,
    tiles: tuple[int, int, int, int],
    head_dim: int = 128,
):
    """``triton.compile`` of a backward kernel (``_bwd_dkdv_kernel`` or ``_bwd_dq_kernel``) for sm_90,
    with ``tiles`` = (BLOCK_M, BLOCK_N, warps, stages) and launch-like specialisation."""
    fn = getattr(K, kernel_name)
    names = fn.arg_names
    ptrs = {
        "Q": "fp8e4nv" if qk_fp8 else "bf16",
        "K": "fp8e4nv" if qk_fp8 else "bf16",
        "V": "fp8e4nv" if pv_fp8 else "bf16",
        "ROW": "fp32",
        "COL": "fp32",
        "DO": "fp8e5" if pv_fp8 else "bf16",
        "STAT": "fp32",
        "DELTA": "fp32",
        "SDO": "fp32",
        "VSCALE": "fp32",
        "DK": "fp32",
        "DV": "fp32",
        "DQ": "bf16",
    }
    bm, bn, warps, stages = tiles
    consts = dict(
        HEAD_DIM=head_dim,
        BLOCK_M=bm,
        BLOCK_N=bn,
        CAUSAL=causal,
        QK_FP8=qk_fp8,
        PV_FP8=pv_fp8,
        LIFT=8,
        IMPRECISE=None,
    )
    consts.update({n: 1 for n in BWD_UNIT_STRIDES if n in names})
    return _compile(fn, ptrs, consts, warps, stages)


def disassemble(cubin_path) -> tuple[str, str]:
    """``(SASS, resource usage)`` of a cubin file, by the cuobjdump that ships with Triton."""
    tool = str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    return tuple(
        subprocess.run([tool, flag, str(cubin_path)], capture_output=True, text=True, check=True).stdout
        for flag in ("-sass", "-res-usage")
    )


def kernel_sass(kernel) -> tuple[str, str]:
    """:func:`disassemble` of a compiled Triton kernel's cubin (written to a temporary file)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        return disassemble(path)


def sass_stats(kernel) -> dict:
    """Registers, dynamic shared bytes and instruction counts of a compiled kernel's SASS."""
    sass, res = kernel_sass(kernel)
    out = {"registers": int(re.findall(r"REG:(\d+)", res)[0]), "dynamic_shared_bytes": kernel.metadata.shared}
    out.update({k.strip(): len(re.findall(re.escape(k), sass)) for k in INSTRUCTIONS})
    return out


def _opcodes(sass: str) -> list[str]:
    """The opcodes of a SASS listing, predicates stripped."""
    return re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass, re.M)


NVFP4_SASS_ROWS = int(os.environ.get("SASS_NVFP4_ROWS", "16"))  # the default launch at D 128
# the quantizer kernels --quant compiles: (module.function of fp4_attention.backends.triton, pointer
# types, constexprs, warps, label)
QUANT_KERNELS = {
    "rows": (
        "quant_fp8._fp8_rows_kernel",
        {"X": "bf16", "Y": "u8", "S": "fp32"},
        dict(D=128, FMAX=448.0, E5M2=False, ROWS=16, BLOCKS=2),
        4,
        "_fp8_rows_kernel D 128 E4M3 2 blocks of 16 rows x 4 warps",
    ),
    "nvfp4": (
        "quant_nvfp4._nvfp4_rows_kernel",
        {
            "X": "bf16",
            "G": "fp32",
            "P": "u8",
            "SC": "u8",
            "DEC": "bf16",
            "BADH": "i32",
            "GOUT": "fp32",
            "TOK": "fp32",
        },
        dict(D=128, ROWS=NVFP4_SASS_ROWS, HEAD_AMAX=True, SIGNS=None, BLOCKS=2),
        4,
        f"_nvfp4_rows_kernel D 128 (per-head global scale) 2 blocks of {NVFP4_SASS_ROWS} rows x 4 warps",
    ),
    "v_amax": (
        "quant_v._v_amax_kernel",
        {"X": "bf16", "AMAX": "fp32", "BAD": "i32"},
        dict(D=128, BLOCK_S=64, ROWS=1024, sxd=1),
        4,
        "_v_amax_kernel D 128 1024 keys (64 per step) x 4 warps",
    ),
    "v_codes": (
        "quant_v._fp8_v_t_kernel",
        {"X": "bf16", "AMAX": "fp32", "BAD": "i32", "SC": "fp32", "Y": "u8"},
        dict(D=128, FMAX=448.0, BLOCK_S=64, PERM16=True, sxd=1),
        4,
        "_fp8_v_t_kernel D 128 perm16 64 keys x 4 warps",
    ),
    "rows_pair": (
        "quant_fp8._fp8_rows_pair_kernel",
        {"X": "bf16", "Y": "u8", "S": "fp32", "X2": "bf16", "Y2": "u8", "S2": "fp32"},
        dict(D=128, FMAX=448.0, E5M2=False, ROWS=16, BLOCKS=2),
        4,
        "_fp8_rows_pair_kernel D 128 E4M3 2 blocks of 16 rows x 4 warps (Q and K bodies)",
    ),
    "rope_pair": (
        "rope._fp8_rope_pair_kernel",
        {
            **{
                n: t for n, t in (("X", "bf16"), ("Y", "u8"), ("S", "fp32"), ("COS", "fp32"), ("SIN", "fp32"))
            },
            **{
                n: t
                for n, t in (("X2", "bf16"), ("Y2", "u8"), ("S2", "fp32"), ("COS2", "fp32"), ("SIN2", "fp32"))
            },
        },
        dict(D=128, FMAX=448.0, E5M2=False, ROWS=16, HEADS=4, BY_BITS=False),
        4,
        "_fp8_rope_pair_kernel D 128 E4M3 16 positions x 4 heads x 4 warps, FP contraction off "
        "(Q and K bodies)",
    ),
    "rope_nvfp4": (
        "rope._nvfp4_rope_rows_kernel",
        {
            **{n: "fp32" for n in ("AMAX", "GOUT", "TOK", "COS", "SIN")},
            **{"X": "bf16", "BADH": "i32", "P": "u8", "SC": "u8", "DEC": "bf16"},
        },
        dict(D=128, ROWS=16, HEADS=4, FAST_DIV=True, BY_BITS=False),
        4,
        "_nvfp4_rope_rows_kernel D 128 16 positions x 4 heads x 4 warps, FP contraction off",
    ),
}
# kernels of rope.py, compiled as they launch: FP contraction off, head counts (8 for K) not 16-divisible
QUANT_ROPE = {"rope_pair", "rope_nvfp4"}


def compile_quant(name: str, blocks: int | None = None):
    """``(compiled kernel, label)`` of the quantizer kernel ``name`` (a key of QUANT_KERNELS), its
    unit channel stride specialised as a contiguous launch specialises it; ``blocks``: another
    number of blocks of rows per program for the row kernels (``rows``, ``rows_pair``, ``nvfp4``)."""
    import importlib

    where, ptrs, consts, warps, label = QUANT_KERNELS[name]
    module, function = where.split(".")
    fn = getattr(importlib.import_module(f"fp4_attention.backends.triton.{module}"), function)
    if blocks is not None:
        if "BLOCKS" not in consts:
            raise ValueError(f"--quant-blocks: {name} has no blocks of rows per program")
        consts = {**consts, "BLOCKS": blocks}
        label = label.replace(f"{QUANT_KERNELS[name][2]['BLOCKS']} blocks of", f"{blocks} block(s) of")
    if name in QUANT_ROPE:
        kernel = _compile(
            fn,
            ptrs,
            consts,
            warps,
            1,
            plain_ints=("H", "H2", "n_programs"),
            enable_fp_fusion=False,
        )
        return kernel, label
    return compile_kernel(fn, ptrs, consts, num_warps=warps), label


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from fp4_attention.backends.triton.backend import default_block_n, default_fwd_tiles

    tile_m, warps, stages = default_fwd_tiles(128)
    p.add_argument("--block-m", type=int, default=tile_m)
    p.add_argument("--block-n", type=int, default=default_block_n(128))
    p.add_argument("--num-warps", type=int, default=warps)
    p.add_argument("--num-stages", type=int, default=stages)
    p.add_argument("--no-split", action="store_true", help="mask every KV tile (the older loop)")
    p.add_argument(
        "--backward", action="store_true", help="the backward kernels at their default tiles instead"
    )
    p.add_argument(
        "--quant",
        choices=sorted(QUANT_KERNELS),
        help="a quantizer kernel instead, at its default launch (D 128): total SASS instructions, those "
        "on the path to the kernel's last EXIT (the IEEE division's slow path and a program's "
        "div_rn fallback branch left out where they are subroutines or behind the EXIT), and the most "
        "frequent opcodes",
    )
    p.add_argument("--quant-rows", action="store_true", help="the same as --quant rows")
    p.add_argument(
        "--quant-blocks",
        type=int,
        choices=(1, 2, 4),
        default=None,
        help="with --quant rows, rows_pair or nvfp4: blocks of rows per program (default: the API's, 2)",
    )
    a = p.parse_args(argv)
    if a.quant_rows:
        a.quant = "rows"
    if a.quant_blocks is not None and not a.quant:
        p.error("--quant-blocks needs --quant rows, rows_pair or nvfp4")
    if a.quant:
        kernel, what = compile_quant(a.quant, a.quant_blocks)
        sass, res = kernel_sass(kernel)
        ops = _opcodes(sass)
        main_path = _opcodes(sass[: sass.rindex("EXIT")])
        print(f"triton {triton.__version__}, sm_90, {what}")
        print(
            f"registers: {re.findall(r'REG:(\d+)', res)[0]}, local-memory (spill) instructions: "
            f"{sum(op.startswith(('STL', 'LDL')) for op in ops)}"
        )
        print(f"instructions (the division's slow path included): {len(ops)}")
        print(f"instructions up to the last EXIT: {len(main_path)}")
        for op, n in collections.Counter(ops).most_common(20):
            print(f"{n:5d} {op}")
        return 0
    cases = [("fp8", True, True), ("nvfp4qk_fp8pv", False, True), ("bf16", False, False)]
    if a.backward:
        from fp4_attention.backends.triton.backend import BWD_DKDV_TILES, BWD_DQ_TILES

        print(
            f"triton {triton.__version__}, sm_90, causal, dK/dV tiles {BWD_DKDV_TILES}, dQ tiles "
            f"{BWD_DQ_TILES}"
        )
        print(
            "| kernel | recipe | "
            + " | ".join(["regs", "dyn smem"] + [k.strip() for k in INSTRUCTIONS])
            + " |"
        )
        print("|---" * (len(INSTRUCTIONS) + 4) + "|")
        for kname, tiles in (("_bwd_dkdv_kernel", BWD_DKDV_TILES), ("_bwd_dq_kernel", BWD_DQ_TILES)):
            for name, qk8, pv8 in cases:
                st = sass_stats(compile_backward(kname, qk_fp8=qk8, pv_fp8=pv8, causal=True, tiles=tiles))
                print(f"| {kname} | {name} | " + " | ".join(str(v) for v in st.values()) + " |", flush=True)
        return 0
    print(
        f"triton {triton.__version__}, sm_90, BLOCK_M {a.block_m}, BLOCK_N {a.block_n}, warps {a.num_warps}, "
        f"stages {a.num_stages}, split {not a.no_split}"
    )
    print(
        "| recipe | causal | " + " | ".join(["regs", "dyn smem"] + [k.strip() for k in INSTRUCTIONS]) + " |"
    )
    print("|---" * (len(INSTRUCTIONS) + 4) + "|")
    for name, qk8, pv8 in cases:
        for causal in (True, False):
            st = sass_stats(
                compile_forward(
                    qk_fp8=qk8,
                    pv_fp8=pv8,
                    causal=causal,
                    block_m=a.block_m,
                    block_n=a.block_n,
                    num_warps=a.num_warps,
                    num_stages=a.num_stages,
                    split=not a.no_split,
                )
            )
            print(f"| {name} | {causal} | " + " | ".join(str(v) for v in st.values()) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
