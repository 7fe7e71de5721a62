"""Numerics of Direct-P for E4M3 P (``fp4_attention.numerics.direct_p_e4m3``) by polynomial degree.

    python bench/direct_p_e4m3_numerics.py --out results/direct_p_e4m3/numerics   # .json + .md, CPU, ~3 s

For each degree of the polynomial for ``2^frac(x)``, against the exact ``2^x`` (float64) rounded to
E4M3 (what the exp2 unit's result rounds to, up to its 2-ulp error):

* ``grid``: every x in [-12, log2 448] in steps of 2^-12 (below 2^-10 E4M3 is 0; above 8, the
  lazy-rescale headroom the recipes allow up to E4M3's 448);
* ``rows``: softmax rows of the FP8 recipes, ``x = (s - max s) log2 e + 8`` for 64 rows of 4,096
  scores ``s ~ N(0, sigma^2)``, sigma in {1, 4}; the E4M3 P of the row, its denominator
  ``sum 2^x`` (float32 terms summed in float64) and ``P V`` for V ~ N(0, 1) (D = 128), each against
  the exact-exp2 path.

Also the issue slots per element of the kernel path (``degree + 5`` in SASS: clamp, two FADDs for
the floor, the subtraction, Horner, one LEA for the exponent; see ``direct_p_e4m3``), against one
MUFU.EX2 (16 per clock per SM on Hopper, an eighth of the FP32 FMA rate).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fp4_attention.numerics.direct_p_e4m3 import exp2_fma, exp2_poly_coeffs, exponent_grid, p_e4m3_exact
from fp4_attention.numerics.formats import round_e4m3
from training.metrics import git_commit

LIFT = 8.0
DEGREES = (1, 2, 3, 4, 5, 6)


def grid_stats(degree: int) -> dict:
    x = exponent_grid()
    exact = torch.exp2(x.double())
    approx = exp2_fma(x, degree)
    p_ref, p = p_e4m3_exact(x), round_e4m3(approx)
    return {
        "values": x.numel(),
        "max_rel_err_fp32": float(((approx.double() - exact) / exact).abs().max()),
        "e4m3_mismatch": float((p != p_ref).double().mean()),
        "monotone": bool((p[1:] >= p[:-1]).all()),
    }


def row_stats(degree: int, sigma: float, rows: int = 64, keys: int = 4096, d: int = 128) -> dict:
    g = torch.Generator().manual_seed(0)
    s = torch.randn(rows, keys, generator=g, dtype=torch.float64) * sigma
    x = ((s - s.amax(-1, keepdim=True)) * math.log2(math.e) + LIFT).float()
    v = torch.randn(keys, d, generator=g, dtype=torch.float64)
    approx = exp2_fma(x, degree)
    p_ref, p = p_e4m3_exact(x), round_e4m3(approx)
    l_ref, l_fma = torch.exp2(x.double()).sum(-1), approx.double().sum(-1)
    o_ref, o = (p_ref.double() @ v) / l_ref[:, None], (p.double() @ v) / l_fma[:, None]
    return {
        "sigma": sigma,
        "e4m3_mismatch": float((p != p_ref).double().mean()),
        "max_rel_err_denominator": float(((l_fma - l_ref) / l_ref).abs().max()),
        "rel_l2_pv": float((o - o_ref).norm() / o_ref.norm()),
    }


def to_markdown(records: list[dict], meta: dict) -> str:
    lines = [
        "# Direct-P for E4M3 P: numerics by polynomial degree",
        "",
        f"- command: `{meta['command']}`",
        f"- date: {meta['date']}; commit {meta['commit']}; {meta['machine']}; torch {meta['torch']}",
        "- reference: exact 2^x (float64) rounded to E4M3; P = 2^x with x = (s - max s) log2 e + 8",
        "- grid: x in [-12, log2 448] in steps of 2^-12",
        (
            "- issue slots per element: degree + 5 (clamp, two FADDs for the floor, subtract, Horner, "
            "one LEA for the exponent) against one MUFU.EX2 (an eighth of the FP32 FMA rate)"
        ),
        "",
        (
            "| degree | coefficients c0..cd (float32) | issue slots / element | grid: max rel err (FP32) "
            "| grid: E4M3 mismatch | grid: monotone | rows s=1: E4M3 mismatch | rows s=1: rel-L2 P V "
            "| rows s=4: E4M3 mismatch | rows s=4: rel-L2 P V | max rel err of l |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        g, r1, r4 = r["grid"], r["rows"][0], r["rows"][1]
        coeffs = ", ".join(f"{c:.7g}" for c in r["coefficients"])
        lerr = max(r1["max_rel_err_denominator"], r4["max_rel_err_denominator"])
        lines.append(
            f"| {r['degree']} | {coeffs} | {r['issue_slots']} | {g['max_rel_err_fp32']:.2e} "
            f"| {g['e4m3_mismatch']:.3%} | {'yes' if g['monotone'] else 'no'} "
            f"| {r1['e4m3_mismatch']:.3%} | {r1['rel_l2_pv']:.1e} | {r4['e4m3_mismatch']:.3%} "
            f"| {r4['rel_l2_pv']:.1e} | {lerr:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = p.parse_args(argv)
    records = []
    for degree in DEGREES:
        rec = {
            "degree": degree,
            "coefficients": list(exp2_poly_coeffs(degree)),
            "issue_slots": degree + 5,
            "grid": grid_stats(degree),
            "rows": [row_stats(degree, s) for s in (1.0, 4.0)],
        }
        records.append(rec)
        print(json.dumps(rec), flush=True)
    meta = {
        "command": "python bench/direct_p_e4m3_numerics.py" + (f" --out {args.out}" if args.out else ""),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit() or "unknown",
        "machine": f"CPU ({platform.machine()})",
        "torch": torch.__version__,
    }
    md = to_markdown(records, meta)
    print(md)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
        out.with_suffix(".md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
