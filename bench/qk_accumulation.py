"""Where the precision of the FP8 QK product goes on Hopper: scores and LSE against float64.

The ``fp8`` recipe's scores are ``(q8 . k8) * s_q * s_k * softmax_scale`` with E4M3 q8/k8. The
reference computes the dot in FP32 (exact products, FP32 sums); on the GPU it is an FP8 MMA (QGMMA,
k32 per instruction), whose accumulator is narrower than FP32 (contract §2). This script measures,
on the kernel's own quantized operands (Triton quantizers), against float64:

* the error of the score ``q8 . k8`` from a Triton ``tl.dot`` of the E4M3 operands with the
  forward kernel's promotion (``max_num_imprecise_acc=32``: FP32 add after every k32 MMA), with
  Triton's default (no promotion), and from the same operands upcast to BF16 (exact) through a
  BF16 MMA; and from cuBLAS ``torch._scaled_mm`` with and without fast accumulation;
* relative to ``A_ij = sum_d |q8_id k8_jd|`` (the size of the sum the accumulator holds);
* the LSE of the Triton ``fp8`` forward and of the reference (FP32, same operands) against float64.

    python bench/qk_accumulation.py --out results/qk_accumulation_h200

Input families are tools/fidelity.py's (``gap=30``: one key 30 above the others, the attention sink
where the LSE error was first seen; ``normal``), B1 Hq8 Hkv2 S1024 D128 causal.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import subprocess
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fp4_attention as fa
from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows
from fp4_attention.numerics.exact import naive_attention
from fp4_attention.numerics.operands import quantize_v
from fp4_attention.numerics.recipes import get_recipe
from fp4_attention.numerics.reference import reference_forward_quantized
from tools.fidelity import make_inputs


@triton.jit
def _scores_kernel(Q, K, S, SEQ, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, MODE: tl.constexpr):
    """S[bh, i, j] = q[bh, i] . k[bh, j] for E4M3 q/k: MODE 0 = FP8 MMA promoted every 32 (as the
    forward kernel), 1 = FP8 MMA with Triton's default accumulation, 2 = BF16 MMA of the upcast."""
    bh, pm, pn = tl.program_id(2), tl.program_id(0), tl.program_id(1)
    m = pm * BM + tl.arange(0, BM)
    n = pn * BN + tl.arange(0, BN)
    d = tl.arange(0, D)
    q = tl.load(Q + bh * SEQ * D + m[:, None] * D + d[None, :])
    kt = tl.load(K + bh * SEQ * D + n[None, :] * D + d[:, None])
    if MODE == 0:
        s = tl.dot(q, kt, max_num_imprecise_acc=32)
    elif MODE == 1:
        s = tl.dot(q, kt)
    else:
        s = tl.dot(q.to(tl.bfloat16), kt.to(tl.bfloat16))
    tl.store(S + bh * SEQ * SEQ + m[:, None] * SEQ + n[None, :], s)


def triton_scores(q8, k8, mode):
    bh, seq, d = q8.shape
    s = torch.empty(bh, seq, seq, dtype=torch.float32, device=q8.device)
    _scores_kernel[(seq // 64, seq // 64, bh)](q8, k8, s, seq, D=d, BM=64, BN=64, MODE=mode, num_warps=4)
    return s


def scaled_mm_scores(q8, k8, fast):
    one = torch.ones((), device=q8.device)
    return torch.stack(
        [
            torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
            for a, b in zip(q8, k8)
        ]
    )


def measure(family: str, args) -> dict:
    b, hq, hkv, s, d = 1, args.hq, args.hkv, args.seqlen, 128
    q, k, v = (t.cuda() for t in make_inputs(family, b, hq, hkv, s, d, args.seed))
    qs, ks = quantize_fp8_rows(q.contiguous()), quantize_fp8_rows(k.contiguous())
    g = hq // hkv
    q8 = qs.data.reshape(b * hq, s, d).contiguous()
    k8 = ks.data.repeat_interleave(g, dim=1).reshape(b * hq, s, d).contiguous()
    exact = torch.matmul(q8.double(), k8.double().transpose(-1, -2))
    mag = torch.matmul(q8.double().abs(), k8.double().abs().transpose(-1, -2))
    causal = torch.ones(s, s, dtype=torch.bool, device="cuda").tril()
    row = {"family": family, "scores": {}}
    variants = {
        "fp8 mma, promoted every k32 (forward kernel)": lambda: triton_scores(q8, k8, 0),
        "fp8 mma, Triton default": lambda: triton_scores(q8, k8, 1),
        "bf16 mma of the upcast (exact operands)": lambda: triton_scores(q8, k8, 2),
        "cuBLAS _scaled_mm": lambda: scaled_mm_scores(q8, k8, False),
        "cuBLAS _scaled_mm fast accum": lambda: scaled_mm_scores(q8, k8, True),
        "fp32 matmul (torch, no tf32)": lambda: torch.matmul(q8.float(), k8.float().transpose(-1, -2)),
    }
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, fn in variants.items():
        err = (fn().double() - exact)[:, causal]
        rel = err.abs() / mag[:, causal].clamp_min(1e-30)
        row["scores"][name] = {
            "max_abs_rel_to_sum_abs": float(rel.max()),
            "mean_signed_rel_to_sum_abs": float((err / mag[:, causal].clamp_min(1e-30)).mean()),
            "max_abs_rel_to_sum_abs_log2": math.log2(max(float(rel.max()), 1e-300)),
        }
    # LSE: Triton forward and the reference on the same quantized Q/K/V, vs float64 on them
    rec = get_recipe("fp8")
    out, lse = fa.attention(
        q, k, v, recipe="fp8", causal=True, layout="bhsd", backend="triton", return_lse=True
    )
    qd, kd = qs.dequantize().double(), ks.dequantize().double()
    _, lse64 = naive_attention(qd, kd, v.double(), causal=True, softmax_scale=d**-0.5)
    _, lse_ref, _ = reference_forward_quantized(
        qs, ks, quantize_v(v, rec), rec, causal=True, softmax_scale=d**-0.5, block_n=64
    )
    a = (
        (
            mag
            * (qs.scale.reshape(b * hq, s, 1).double())
            * ks.scale.repeat_interleave(g, 1).reshape(b * hq, 1, s).double()
            * d**-0.5
        )
        .masked_fill(~causal, 0)
        .amax(-1)
        .reshape(b, hq, s)
    )
    for name, got in (("triton fp8 forward", lse), ("reference (fp32)", lse_ref)):
        e = (got.double() - lse64).abs()
        row.setdefault("lse", {})[name] = {
            "max_abs": float(e.max()),
            "max_abs_over_A": float((e / a.clamp_min(1e-30)).max()),
            "max_A": float(a.max()),
        }
    return row


def to_markdown(rows, command) -> str:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        "# FP8 QK accumulation on the GPU vs float64",
        "",
        f"- command: `{command}`",
        f"- date {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M UTC}; commit {commit}; "
        f"{torch.cuda.get_device_name()}; torch {torch.__version__}, Triton {triton.__version__}",
        "- scores: max |s - s*| / A with A = sum_d |q8_d k8_d| (the size of the sum), over causal entries;"
        " mean signed error / A shows a bias (truncation)",
        "",
        "| inputs | scores from | max err / A | (log2) | mean signed err / A |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        for name, m in r["scores"].items():
            lines.append(
                f"| {r['family']} | {name} | {m['max_abs_rel_to_sum_abs']:.2e} | "
                f"{m['max_abs_rel_to_sum_abs_log2']:.1f} | {m['mean_signed_rel_to_sum_abs']:.2e} |"
            )
    lines += [
        "",
        "| inputs | LSE from | max abs err vs float64 | max err / A_row | max A_row |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        for name, m in r["lse"].items():
            lines.append(
                f"| {r['family']} | {name} | {m['max_abs']:.2e} | "
                f"{m['max_abs_over_A']:.2e} | {m['max_A']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=["gap=30", "normal", "sink"])
    p.add_argument("--hq", type=int, default=8)
    p.add_argument("--hkv", type=int, default=2)
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("qk_accumulation: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = [measure(f, args) for f in args.families]
    md = to_markdown(
        rows, "python bench/qk_accumulation.py " + " ".join(sys.argv[1:] if argv is None else argv)
    )
    print(md)
    if args.out:
        Path(args.out + ".md").write_text(md)
        Path(args.out + ".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
