"""What lazy rescaling would cost and how often a forward that speculates on the running max would miss.

The CuTe fp8 forward computes each KV tile's row max (FMNMX over the tile, a quad shuffle) before
its exponentials; a probe without that max ran 7-9% faster on the H200
(``results/cute_fwd_price2_h200``). A kernel can take the max off that path by computing the
exponentials against the running max ``m`` it already has, computing the tile max beside them, and
redoing only the rows whose max moved: bit-identical to the recipe when "moved" is the recipe's own
rule. The recipe's rule is the reference's lazy rescaling (``reference.py``: ``m_new = m_tile if
m_tile > m + threshold else m``; ``fp8`` today has threshold 0; contract §2 allows up to
``log2(448) - LIFT = 0.807``). This script measures, on the CPU with the reference:

1. fidelity: cosine and relative L2 against float64 of the ``fp8`` recipe's output and gradients
   at each threshold, on ``tools/fidelity.py``'s input families (B1 H8/2 S1024 D128 causal, KV
   tiles of 128 visited last to first, as the CuTe kernel);
2. the miss rate a speculating kernel would see: over the KV tiles after each query block's first,
   the fraction of (16-row warp slice, tile) pairs in which at least one row's tile max exceeds
   ``m + threshold`` (a warp then runs the redo path), and the fraction of rows that do.

    python bench/max_speculation.py --out results/max_speculation_cpu
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tools"))

from fidelity import _metrics, float64_case  # noqa: E402

import fp4_attention as fa  # noqa: E402
from fp4_attention.numerics.recipes import E4M3_MAX_LOG2, P_LIFT_LOG2  # noqa: E402

LOG2E = 1.4426950408889634
MAX_THRESHOLD = E4M3_MAX_LOG2 - P_LIFT_LOG2


def miss_rates(q, k, threshold: float, block_n: int = 128, block_m: int = 128, rows_per_warp: int = 16):
    """(warp-slice miss rate, row miss rate) of a speculating forward at ``threshold`` (log2 units),
    causal, KV tiles visited last to first from each query block's diagonal; BF16-exact FP32
    scores (the quantization does not move the max by much: this counts events, not values)."""
    b, hq, s, d = q.shape
    group = hq // k.shape[1]
    warp_miss = warp_total = row_miss = row_total = 0
    for h in range(hq):
        z = (q[0, h].float() @ k[0, h // group].float().T) * (d**-0.5 * LOG2E)  # [S, S], log2 units
        z = z.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -torch.inf)
        for m0 in range(0, s, block_m):
            rows = z[m0 : m0 + block_m]
            last = (min(m0 + block_m, s) - 1) // block_n  # the diagonal tile, visited first
            m = rows[:, last * block_n : (last + 1) * block_n].amax(-1)
            for j in range(last - 1, -1, -1):
                tile_max = rows[:, j * block_n : (j + 1) * block_n].amax(-1)
                miss = tile_max > m + threshold
                row_miss += int(miss.sum())
                row_total += miss.numel()
                per_warp = miss.view(-1, rows_per_warp).any(-1)
                warp_miss += int(per_warp.sum())
                warp_total += per_warp.numel()
                m = torch.where(miss, tile_max, m)
    return warp_miss / max(warp_total, 1), row_miss / max(row_total, 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="PREFIX: writes PREFIX.md and PREFIX.json")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.0, 0.5, MAX_THRESHOLD])
    p.add_argument(
        "--families", nargs="+", default=["normal", "outliers", "sink", "std=4", "gap=20", "channels=8"]
    )
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    if any(t < 0 or t > MAX_THRESHOLD + 1e-9 for t in a.thresholds):
        p.error(f"--thresholds must lie in [0, {MAX_THRESHOLD:.3f}] (contract §2's saturation invariant)")
    records = []
    for family in a.families:
        q, k, v, dout, out64, (dq64, dk64, dv64) = float64_case(family, 1, 8, 2, 1024, 128, a.seed)
        for th in a.thresholds:
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            out = fa.attention(
                qq,
                kk,
                vv,
                recipe="fp8",
                causal=True,
                layout="bhsd",
                backend="reference",
                rescale_threshold=th,
            )
            out.backward(dout)
            warp, row = miss_rates(q, k, th)
            rec = {"family": family, "threshold": round(th, 4), "warp_miss": warp, "row_miss": row}
            for name, got, ref in (
                ("out", out, out64),
                ("dq", qq.grad, dq64),
                ("dk", kk.grad, dk64),
                ("dv", vv.grad, dv64),
            ):
                rec[name] = _metrics(got.detach(), ref)
            records.append(rec)
            print(json.dumps(rec), flush=True)
    lines = [
        "# Lazy rescaling of the fp8 forward: fidelity, and the miss rate of max speculation "
        "(reference, CPU)",
        "",
        f"- command: `python bench/max_speculation.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
        f"- date: {_dt.datetime.now(_dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; torch {torch.__version__}; "
        f"seed {a.seed}",
        "- shape: B=1, Hq=8, Hkv=2, S=1024, D=128, causal; KV tiles of 128 keys visited last to first; "
        "cells: cosine / relative L2 against float64 on the same BF16 inputs",
        "- threshold: the reference's lazy-rescale threshold in log2 units (`fp8` today: 0; "
        f"the contract's limit with P lifted by 2^{P_LIFT_LOG2}: {MAX_THRESHOLD:.3f}); misses: of the KV "
        "tiles after each query block's first, the share of (16-row warp slice, tile) pairs with a row "
        "whose tile max exceeds the running max + threshold, and the share of such rows",
        "",
        "| inputs | threshold | warp misses | row misses | out | dQ | dK | dV |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        cells = " | ".join(f"{r[n][0]:.5f} / {r[n][1]:.4f}" for n in ("out", "dq", "dk", "dv"))
        lines.append(
            f"| {r['family']} | {r['threshold']:.3f} | {r['warp_miss']:.3f} | {r['row_miss']:.4f} | {cells} |"
        )
    md = "\n".join(lines) + "\n"
    print(md)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out + ".md").write_text(md)
        Path(a.out + ".json").write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
