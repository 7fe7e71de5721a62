"""Compile the CuTe fp8 forward (or, with --backward, the backward) for sm_90a on any machine (no GPU) and
count its SASS instructions; ``sass_sha256`` digests the whole SASS (equal digests: the same code).

    CUTE_DSL_ARCH=sm_90a PYTHONPATH=<site with nvidia-cutlass-dsl, flash-attn-4> \\
        python bench/cute_sass_report.py [--tiles 128,128,2] [--qk-bf16]
        python bench/cute_sass_report.py --backward [--group 4] [--head-dim 128] [--non-causal]

The CUTLASS DSL compiles to cubin without a GPU (``CUTE_DSL_KEEP=cubin``, set on import of this
module, which must come before the first import of ``cutlass``); Triton's bundled
``cuobjdump`` disassembles it. Reports registers, stack, spill loads/stores (STL/LDL), QGMMA (FP8
wgmma), MUFU.EX2 and F2FP (the E4M3 packing of P) counts. The operands are descriptors of CUDA
tensors (``arguments.cute_operand``), so the kernel is the one a GPU compiles.

Which build of the DSL's compiler: the H200 runs the GPU bundle's CUDA 13 build, the CPU venv has the
CUDA 12 one, and their SASS differ (2026-12-05, fp8 forward at 128x192: 754 against 756 instructions
in the unmasked KV loop, 128x224: 32 against 29 spill stores; backward loop 462 against 468). For the
H200's SASS run this with the bundle's DSL: ``source .gpu-bundle/install.sh .gpu-bundle /tmp/gpusite``
(it exports PYTHONPATH), then ``.venv/bin/python bench/cute_sass_report.py ...``; the JSON's
``dsl_compiler`` names the build (``compile_cache.compiler_dso``).
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The DSL reads these when it is first imported: set them before anything imports cutlass.
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ["CUTE_DSL_KEEP"] = "cubin"
if "CUTE_DSL_DUMP_DIR" not in os.environ:  # a temporary one, removed at exit
    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="cute_sass_")
    atexit.register(shutil.rmtree, os.environ["CUTE_DSL_DUMP_DIR"], ignore_errors=True)
DUMP_DIR = os.environ["CUTE_DSL_DUMP_DIR"]

from sass_report import disassemble  # noqa: E402  (bench/, beside this file: Triton's cuobjdump)


def _dsl_compiler() -> str:
    from fp4_attention.backends.cute.compile_cache import compiler_dso

    return compiler_dso()[0]


def compile_report(tiles=(128, 128, 2), causal=True, group=4, head_dim=128, **kernel_options) -> dict:
    """Compile ``FP8ForwardSm90`` for sm_90a with fake CPU operands; return the instruction counts."""
    import torch

    for old in Path(DUMP_DIR).rglob("*.cubin"):
        old.unlink()
    import cutlass
    from cutlass import cute

    from fp4_attention.backends.cute.arguments import cute_operand
    from fp4_attention.backends.cute.fwd_sm90 import FP8ForwardSm90

    b, hkv, s, d = 1, 2, 512, head_dim
    hq = hkv * group
    qk_dtype = torch.bfloat16 if kernel_options.get("qk_bf16") else torch.float8_e4m3fn
    q = torch.zeros(b, hq, s, d, dtype=qk_dtype).permute(0, 2, 1, 3)
    k = torch.zeros(b, hkv, s, d, dtype=qk_dtype).permute(0, 2, 1, 3)
    vt = torch.zeros(b, hkv, d, s, dtype=torch.float8_e4m3fn).permute(0, 3, 1, 2)
    o = torch.empty(b, hq, s, d, dtype=torch.bfloat16).permute(0, 2, 1, 3)
    small = [torch.empty(b, hq, s), torch.ones(b, hq, s), torch.ones(b, hkv, s), torch.ones(b, hkv, d)]
    # CUDA-tensor descriptors (arguments.cute_operand): the kernel a GPU compiles, global memory
    args = [cute_operand(t, leading_dim=3) for t in (q, k)] + [
        cute_operand(vt, leading_dim=1),
        cute_operand(o, leading_dim=3),
    ]
    args += [cute_operand(t, assumed_align=4, leading_dim=2) for t in small]
    kernel = FP8ForwardSm90(
        d, group, causal, tile_m=tiles[0], tile_n=tiles[1], num_stages=tiles[2], **kernel_options
    )
    cute.compile(
        kernel,
        *args,
        cutlass.Float32(1.0),  # qk_scale_log2
        cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True),
        options="--enable-tvm-ffi",
    )
    cubins = list(Path(DUMP_DIR).rglob("*.cubin"))
    if len(cubins) != 1:
        raise RuntimeError(f"expected one cubin in the dump, found {len(cubins)}")
    sass, res = disassemble(cubins[0])
    ins = _instructions(sass)
    loops = inner_loops(sass)
    spans = [(int(loop["start"], 16), int(loop["end"], 16)) for loop in loops]
    outside = [(op, rest) for a, op, rest in ins if not any(s0 <= a <= e0 for s0, e0 in spans)]

    def count(prefix: str) -> int:
        return sum(op.startswith(prefix) for _, op, _ in ins)

    usage = dict(re.findall(r"(REG|STACK):(\d+)", res))
    return {
        "tiles": list(tiles),
        "causal": causal,
        "group": group,
        "head_dim": head_dim,
        **kernel_options,
        "dsl_compiler": _dsl_compiler(),
        "reg": int(usage.get("REG", -1)),
        "stack": int(usage.get("STACK", -1)),
        "STL": count("STL"),
        "LDL": count("LDL"),
        "QGMMA": count("QGMMA"),
        "HGMMA": count("HGMMA"),
        "MUFU.EX2": count("MUFU.EX2"),
        "F2FP": count("F2FP"),
        "sass_sha256": sass_digest(ins),
        "inner_loops": loops,
        # outside the KV-tile loops (the peeled first tile, the prologue and epilogue): the
        # warp-scheduler turns (named barriers with a register id; the fixed-id ones are the CTA's
        # and the epilogue's) and the integer min/max instructions (index clamps)
        "turn_sync_outside_loops": sum(
            op.startswith("BAR.SYNC") and _reg_first(rest) for op, rest in outside
        ),
        "turn_arrive_outside_loops": sum(
            op.startswith("BAR.ARV") and _reg_first(rest) for op, rest in outside
        ),
        "int_minmax_outside_loops": sum(op.startswith(("VIMNMX", "VIADDMNMX", "IMNMX")) for op, _ in outside),
    }


def compile_bwd(causal=True, group=4, head_dim=128, seq=512, qk_bf16=False):
    """``FP8BackwardSm90`` compiled for the DSL's target (sm_90a here) on descriptors of CUDA operands
    (``arguments.cute_operand``, no GPU):
    the compiled function (its cubin is in the dump directory). ``qk_bf16``: the nvfp4qk_fp8pv
    kernel (BF16 Q/K in the E4M3 Q/K slots, S^T as a BF16 wgmma, the token scales on two dS)."""
    import cutlass
    import torch
    from cutlass import cute

    from fp4_attention.backends.cute.arguments import cute_operand
    from fp4_attention.backends.cute.bwd_sm90 import FP8BackwardSm90

    b, hkv, s, d = 1, 2, seq, head_dim
    hq = hkv * group
    e4, e5, bf = torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16

    def bshd(h, dt):  # a (B, S, H, D) view of [B, H, S, D] memory, as the backend passes them
        return cute_operand(torch.zeros(b, h, s, d, dtype=dt).permute(0, 2, 1, 3), 3)

    def vec(*shape, align=4):
        return cute_operand(torch.zeros(shape), len(shape) - 1, align)

    # CUDA-tensor descriptors (arguments.cute_operand), in backend._bwd_args order: the kernel a GPU compiles
    qk = bf if qk_bf16 else e4
    args = [bshd(hq, qk), bshd(hq, bf), bshd(hkv, qk), bshd(hkv, bf), bshd(hkv, e4), bshd(hq, e5)]
    args.append(cute_operand(torch.zeros(b, hq, d, s, dtype=e5).permute(0, 3, 1, 2), 1))  # dO^T
    args += [vec(b, hq, s) for _ in range(4)] + [vec(b, hkv, s) for _ in range(2)]
    args += [vec(b, hq), vec(b, hkv, d), vec(b, hq, s * d, align=16)]
    if group == 1:
        args += [bshd(hkv, bf), bshd(hkv, bf)]
    else:
        args += [vec(b, hkv, s * d, align=16) for _ in range(2)]
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(
        FP8BackwardSm90(d, group, causal, qk_bf16=qk_bf16),
        *args,
        cutlass.Float32(0.1),
        stream,
        options="--enable-tvm-ffi",
    )


def compile_bwd_report(causal=True, group=4, head_dim=128, qk_bf16=False) -> dict:
    """Compile ``FP8BackwardSm90`` for sm_90a with fake operands (no GPU); return its instruction counts."""
    for old in Path(DUMP_DIR).rglob("*.cubin"):
        old.unlink()
    compile_bwd(causal, group, head_dim, qk_bf16=qk_bf16)
    cubins = list(Path(DUMP_DIR).rglob("*.cubin"))
    if len(cubins) != 1:
        raise RuntimeError(f"expected one cubin in the dump, found {len(cubins)}")
    sass, res = disassemble(cubins[0])
    ins = _instructions(sass)
    usage = dict(re.findall(r"(REG|STACK):(\d+)", res))
    counts = {
        k: sum(op.startswith(k) for _, op, _ in ins)
        for k in ("STL", "LDL", "QGMMA", "HGMMA", "MUFU.EX2", "F2FP")
    }
    return {
        "causal": causal,
        "group": group,
        "head_dim": head_dim,
        "qk_bf16": qk_bf16,
        "dsl_compiler": _dsl_compiler(),
        "reg": int(usage.get("REG", -1)),
        "stack": int(usage.get("STACK", -1)),
        **counts,
        "instructions": len(ins),
        "sass_sha256": sass_digest(ins),
        "inner_loops": inner_loops(sass),
    }


def sass_digest(ins: list[tuple[int, str, str]]) -> str:
    """SHA-256 of the instructions (address, opcode and operands, in order): equal digests mean the
    same SASS, instruction for instruction (the claim "bit-identical SASS" of a refactor)."""
    text = "\n".join(f"{a:x} {op} {rest}" for a, op, rest in ins)
    return hashlib.sha256(text.encode()).hexdigest()


def _instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of every instruction, predicates dropped."""
    return [
        (int(a, 16), op, rest)
        for a, op, rest in re.findall(
            r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass
        )
    ]


def _reg_first(operands: str) -> bool:
    """Whether the first operand is a register (R...), as the barrier id of the warp-scheduler turn is."""
    return bool(re.match(r"\s*R\d+", operands))


SCHEDULE_OPS = ("QGMMA", "HGMMA", "BAR.SYNC", "BAR.ARV", "WARPGROUP.DEPBAR")  # the GEMM / turn order
LOOP_OPS = ("QGMMA", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "F2FP", "LDG", "SHFL", "STL", "LDL")


def _schedule_label(op: str) -> str:
    """QGMMA / HGMMA (a wgmma issue), DEPBAR (a wgmma wait), BAR.SYNC / BAR.ARV (warp-scheduler turn)."""
    if op.startswith("BAR."):
        return ".".join(op.split(".")[:2])
    return "DEPBAR" if op.startswith("WARPGROUP.DEPBAR") else op.split(".")[0]


def inner_loops(sass: str, min_len: int = 200) -> list[dict]:
    """Instruction histograms of the innermost loops (a backward branch whose body holds no other
    loop) of at least ``min_len`` instructions: the KV-tile loops of the consumer warpgroups. Counts
    are per warp and per loop trip (one KV tile); ``QK_zero_init`` the QK wgmmas that start a new
    accumulator (one per FP32-promoted partial sum); ``LDG_before_first_GMMA`` the global loads
    (the K token scales) issued before the tile's first wgmma; ``schedule`` the order of wgmma issues,
    wgmma waits and warp-scheduler barrier syncs/arrives in the loop body."""
    ins = _instructions(sass)
    spans = []
    for a, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < a:
            spans.append((int(target.group(1), 16), a))
    inner = [
        (s0, e0)
        for s0, e0 in spans
        if not any(s0 <= s1 and e1 <= e0 and (s1, e1) != (s0, e0) for s1, e1 in spans)
    ]
    out = []
    for s0, e0 in inner:
        body_ins = [(op, rest) for a, op, rest in ins if s0 <= a <= e0]
        body = [op for op, _ in body_ins]
        if len(body) >= min_len:
            first_mma = next((i for i, o in enumerate(body) if o.startswith(("QGMMA", "HGMMA"))), len(body))
            # QK products into a zeroed accumulator (A from shared memory: "Rd, gdesc[..], RZ, !UPT")
            qk_zero = sum(
                op.startswith(("QGMMA", "HGMMA"))
                and re.match(r"\S* R\d+, gdesc\[[^]]*\], RZ, !UPT", rest) is not None
                for op, rest in body_ins
            )
            out.append(
                {
                    "start": hex(s0),
                    "end": hex(e0),
                    "instructions": len(body),
                    "QK_zero_init": qk_zero,
                    **{k: sum(o.split(".")[0] == k for o in body) for k in LOOP_OPS},
                    "LDG_before_first_GMMA": sum(o.startswith("LDG") for o in body[:first_mma]),
                    "MUFU_F16": sum(o.startswith("MUFU.EX2.F16") for o in body),
                    "schedule": " ".join(_schedule_label(o) for o in body if o.startswith(SCHEDULE_OPS)),
                }
            )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backward", action="store_true", help="the backward kernel (FP8BackwardSm90)")
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--tiles", default="128,128,2")
    p.add_argument("--non-causal", action="store_true")
    p.add_argument("--qk-bf16", action="store_true", help="BF16 Q/K (the nvfp4qk_fp8pv kernels)")
    a = p.parse_args(argv)
    if a.backward:
        rep = compile_bwd_report(not a.non_causal, a.group, a.head_dim, a.qk_bf16)
        print(json.dumps(rep))
        return 0
    rep = compile_report(
        tuple(int(x) for x in a.tiles.split(",")),
        causal=not a.non_causal,
        qk_bf16=a.qk_bf16,
    )
    print(json.dumps(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
