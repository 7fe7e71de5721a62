"""The dP = dO8 . V8^T product of the FP8 backward: three accumulations, measured in one run.

dS = P (dP - D) cancels on a key that holds its row's mass, so there the absolute error of dP is
the error of dS (D is an FP32 sum). Hopper's FP8 MMA accumulates a k32 instruction with about 14
bits relative to the sum of |products| (results/robustness_h200/qk_accumulation_h200.md), Triton's
default for an FP8 dot never promotes (about 11 bits over D = 128), and a BF16 MMA of the same
operands upcast (E5M2 and E4M3 are exact in BF16) accumulates like FP32. Variants (the Triton
backward's ``dp_mma``): 0 = FP8 MMA, Triton default; 1 = FP8 MMA promoted to FP32 every k32;
2 = BF16 MMA of the upcast operands.

    python bench/dp_accumulation.py --out results/robustness_h200/dp_accumulation_h200

For each: dQ/dK error on the dominant-key family (tests/numerics/dominant.py: against float64 on
the recipe's dequantized operands, beside the bf16 recipe's error), dQ/dK/dV cosine on N(0, 1)
against float64, and the backward's time (median, triton.testing.do_bench) at the 8B training
shape B4 Hq32/Hkv8 S4096 D128 causal and at B2 H32/32 S8192 non-causal, with the bf16 recipe's
backward as the same-run yardstick.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fp4_attention.backends.triton.backend import TritonBackend
from fp4_attention.numerics.exact import naive_attention
from fp4_attention.numerics.recipes import get_recipe
from tests.numerics.dominant import dominant_inputs, exact_grads
from tools.fidelity import make_inputs

VARIANTS = {0: "fp8 mma (Triton default)", 1: "fp8 mma, promoted every k32", 2: "bf16 mma of the upcast"}
BE = TritonBackend()


def grads(q, k, v, dout, recipe, causal, dp_mma):
    rec = get_recipe(recipe)
    sc = q.shape[-1] ** -0.5
    qq, kk, vv = (t.cuda() for t in (q, k, v))
    _, _, st = BE.forward(qq, kk, vv, rec, causal=causal, softmax_scale=sc)
    return [
        t.float().cpu()
        for t in BE.backward(st, dout.cuda(), rec, causal=causal, softmax_scale=sc, dp_mma=dp_mma)
    ]


def dominant_rows(gap, s, hq, hkv):
    q, k, v, dout = dominant_inputs(gap, 1, hq, hkv, s, 128)
    ex = {r: exact_grads(q, k, v, dout, r, True, device="cuda") for r in ("bf16", "fp8", "nvfp4qk_fp8pv")}
    bf = grads(q, k, v, dout, "bf16", True, 0)
    e_bf = [float((bf[i].double() - ex["bf16"][i]).norm()) for i in (0, 1)]
    rows = []
    for var in VARIANTS:
        for r in ("fp8", "nvfp4qk_fp8pv"):
            g = grads(q, k, v, dout, r, True, var)
            e = [float((g[i].double() - ex[r][i]).norm()) for i in (0, 1)]
            n = [float(ex[r][i].norm()) for i in (0, 1)]
            rows.append(dict(gap=gap, s=s, variant=var, recipe=r, err=e, exact=n, bf16_err=e_bf))
    return rows


def cosines(var):
    q, k, v = make_inputs("normal", 1, 8, 2, 1024, 128, 1234)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1235)).bfloat16()
    qd, kd, vd = (t.cuda().double().requires_grad_() for t in (q, k, v))
    o, _ = naive_attention(qd, kd, vd, causal=True, softmax_scale=128**-0.5)
    o.backward(dout.cuda().double())
    g = grads(q, k, v, dout, "fp8", True, var)
    out = []
    for a, b in zip(g, (qd.grad, kd.grad, vd.grad)):
        a, b = a.double().flatten(), b.cpu().flatten()
        out.append(float(a @ b / (a.norm() * b.norm())))
    return out


def bwd_ms(recipe, var, b, hq, hkv, s, causal):
    rec = get_recipe(recipe)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, hq, s, 128, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(b, hkv, s, 128, device="cuda", generator=g).bfloat16() for _ in range(2))
    dout = torch.randn(q.shape, device="cuda", generator=g).bfloat16()
    _, _, st = BE.forward(q, k, v, rec, causal=causal, softmax_scale=128**-0.5)
    fn = lambda: BE.backward(st, dout, rec, causal=causal, softmax_scale=128**-0.5, dp_mma=var)  # noqa: E731
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    res = {"commit": commit, "gpu": torch.cuda.get_device_name(), "dominant": [], "cos": {}, "ms": {}}
    for gap in (10, 20, 30):
        res["dominant"] += dominant_rows(gap, 1024, 8, 2)
    for var in VARIANTS:
        res["cos"][var] = cosines(var)
    shapes = {"B4 H32/8 S4096 causal": (4, 32, 8, 4096, True), "B2 H32/32 S8192": (2, 32, 32, 8192, False)}
    for name, sh in shapes.items():
        res["ms"][name] = {"bf16": bwd_ms("bf16", 0, *sh)}
        for var in VARIANTS:
            res["ms"][name][var] = bwd_ms("fp8", var, *sh)
    lines = [
        "# dP accumulation of the FP8 backward (Triton)",
        "",
        f"- `python bench/dp_accumulation.py`; commit {commit}; {res['gpu']}; torch {torch.__version__}",
        "",
        "| gap | recipe | dP product | dQ err | dK err | bf16 dQ / dK err | exact dQ / dK norm |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res["dominant"]:
        lines.append(
            f"| {r['gap']} | {r['recipe']} | {VARIANTS[r['variant']]} | {r['err'][0]:.2e} | "
            f"{r['err'][1]:.2e} | "
            f"{r['bf16_err'][0]:.1e} / {r['bf16_err'][1]:.1e} | {r['exact'][0]:.1e} / {r['exact'][1]:.1e} |"
        )
    lines += ["", "| dP product | fp8 dQ / dK / dV cosine, N(0,1) S1024 |", "|---|---|"]
    for var, c in res["cos"].items():
        lines.append(f"| {VARIANTS[var]} | {c[0]:.5f} / {c[1]:.5f} / {c[2]:.5f} |")
    lines += [
        "",
        "| shape | bf16 recipe bwd ms | " + " | ".join(f"fp8, {VARIANTS[v]}" for v in VARIANTS) + " |",
    ]
    lines.append("|---|---|" + "---|" * len(VARIANTS))
    for name, m in res["ms"].items():
        lines.append(f"| {name} | {m['bf16']:.3f} | " + " | ".join(f"{m[v]:.3f}" for v in VARIANTS) + " |")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        Path(args.out + ".md").write_text(md)
        Path(args.out + ".json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
