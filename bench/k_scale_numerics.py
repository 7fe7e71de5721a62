"""What one K scale per KV tile would cost in fidelity (the forward issue's item 2), on the CPU.

    python bench/k_scale_numerics.py --out results/k_scale_numerics_cpu     # writes .md and .json

The ``fp8`` recipe gives K one E4M3 scale per token. A per-token scale multiplies every score
element in the kernel (key j's score carries ``s_k[j]``; no FP8 tensor-core operand carries a
per-column scale), and on the H200 that multiply and its loads took 11-19% of the CuTe forward's
time (``results/cute_fwd_price_h200``). One scale per tile of keys would fold into the per-row
factor of the exponential's FMA, which is already there. This script prices that option's
numerics: the ``fp8`` recipe's reference forward and backward (``reference_forward_quantized``,
``reference_backward``) with K quantized per tile of ``--tile`` keys, or per (batch, head) (a
scale that folds into the softmax scale), instead of per token, with and without smoothing K by
its mean over the tokens of each (batch, head) first. That is SageAttention's trick:
``q . (k - mean)`` shifts each row's scores by the constant ``q . mean``, which the softmax
ignores; the gradient of K is unchanged, since each row's dS sums to zero; the LSE would be
restored by adding ``softmax_scale * q . mean``. Q keeps its per-token scale, V its per-channel one.

Cells: cosine / relative L2 of the output and of dQ/dK/dV against float64 attention on the same
BF16 inputs, on the input families of ``tools/fidelity.py``; every variant in the same run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tools"))

from fidelity import _metrics, float64_case  # noqa: E402

import fp4_attention as fa  # noqa: E402
from fp4_attention.numerics.operands import quantize_qk, quantize_v  # noqa: E402
from fp4_attention.numerics.quant import FP8Tensor, quantize_fp8, quantize_fp8_key_groups  # noqa: E402
from fp4_attention.numerics.reference import reference_backward, reference_forward_quantized  # noqa: E402

FAMILIES = ("normal", "outliers", "sink", "std=0.5", "std=1", "std=2", "std=4", "gap=20", "channels=8")
VARIANTS = (
    "token (definition)",
    "tile",
    "head",
    "smooth+token",
    "smooth+tile",
    "smooth+head",
    "pow2 token",
    "pow2 tile",
)


def quantize_k(k: torch.Tensor, variant: str, tile: int) -> FP8Tensor:
    """BF16 K ``[B, H, S, D]`` as ``variant`` (one of :data:`VARIANTS`) quantizes it to E4M3: one
    scale per token, per ``tile`` keys or per (batch, head); ``smooth+``: K minus its mean over the
    tokens of each (batch, head), in FP32, quantized so; ``pow2 ``: the scales rounded up to powers
    of two (a per-tile power of two folds into the kernels' per-row factor with the same bits as
    the per-element multiply: ``t * 2^e`` is exact).

    Raises:
        ValueError: an unknown variant.
    """
    if variant not in VARIANTS:
        raise ValueError(f"quantize_k: unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    x = k.float() - k.float().mean(dim=2, keepdim=True) if variant.startswith("smooth") else k.float()
    pow2 = variant.startswith("pow2")
    if variant.endswith("tile"):
        return quantize_fp8_key_groups(x, tile, pow2=pow2)
    if variant.endswith("head"):
        return quantize_fp8_key_groups(x, x.shape[2])
    return quantize_fp8(x, "e4m3", dims=(-1,), pow2=pow2)


def run(args) -> list[dict]:
    """One row per (input family, K variant): the cosine / relative L2 of out, dQ, dK, dV."""
    rec = fa.get_recipe("fp8")
    sm = args.headdim**-0.5
    rows = []
    for family in args.families:
        q, k, v, dout, out64, (dq64, dk64, dv64) = float64_case(
            family, 1, args.hq, args.hkv, args.seqlen, args.headdim, args.seed
        )
        q_s, _ = quantize_qk(q, k, rec)
        v_s = quantize_v(v, rec)
        for variant in args.variants:
            k_s = quantize_k(k, variant, args.tile)
            out, _, state = reference_forward_quantized(q_s, k_s, v_s, rec, causal=True, softmax_scale=sm)
            dq, dk, dv = reference_backward(state, dout, rec, causal=True, softmax_scale=sm)
            row = {
                "family": family,
                "K": variant,
                "out": _metrics(out, out64),
                "dq": _metrics(dq, dq64),
                "dk": _metrics(dk, dk64),
                "dv": _metrics(dv, dv64),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def to_markdown(rows: list[dict], args, command: str) -> str:
    """The table of :func:`run`'s rows, with the command and the shape."""
    lines = [
        "# One K scale per KV tile: fidelity of the fp8 recipe (reference forward and backward, CPU)",
        "",
        f"- command: `{command}`",
        f"- date: {_dt.datetime.now(_dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; machine {platform.machine()} "
        f"CPU; torch {torch.__version__}",
        f"- shape: B=1, Hq={args.hq}, Hkv={args.hkv}, S={args.seqlen}, D={args.headdim}, causal; K tile "
        f"{args.tile} keys; cells: cosine / relative L2 against float64 on the same BF16 inputs",
        "",
        "| inputs | K scales | out | dQ | dK | dV |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = " | ".join(f"{r[m][0]:.5f} / {r[m][1]:.4f}" for m in ("out", "dq", "dk", "dv"))
        lines.append(f"| {r['family']} | {r['K']} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """Command line (module docstring); exit status 2 for a bad ``--tile``."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=list(FAMILIES))
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--tile", type=int, default=128, help="keys per K scale (the kernel's KV tile)")
    p.add_argument("--hq", type=int, default=8)
    p.add_argument("--hkv", type=int, default=2)
    p.add_argument("--seqlen", type=int, default=1024)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--seed", type=int, default=1234, help="the inputs' seed (tools/fidelity.py's default)")
    p.add_argument("--out", default=None, help="write <out>.md and <out>.json")
    args = p.parse_args(argv)
    if args.tile < 1:
        print(f"k_scale_numerics: --tile must be >= 1, got {args.tile}", file=sys.stderr)
        return 2
    rows = run(args)
    command = "python bench/k_scale_numerics.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
        Path(args.out + ".md").write_text(to_markdown(rows, args, command.strip()))
    print(to_markdown(rows, args, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
