"""How the CuTe backward's CTA launch order balances causal work over the SMs: a greedy model.

    python bench/bwd_schedule_model.py [--sms 132] [--seq 4096] [--overhead 0 2] [--out PREFIX]

The backward launches one CTA per (KV block of 128 keys, head, batch), non-persistent, one CTA per SM
at a time (its registers and shared memory). With a causal mask KV block ``n`` is seen by the query
blocks from its own on: ``2 (N - n)`` blocks of 64 queries for N = S / 128 KV blocks (Sq = Sk), so
the first KV blocks carry the most work. The GPU hands CTAs to SMs in launch order as SMs free up;
this model does the same (greedy list scheduling: each CTA starts on the SM that frees first) with a
CTA's time = its query blocks (+ ``overhead`` blocks' worth of fixed cost per CTA: prologue, epilogue)
and reports each order's makespan over the balanced time (total work / SMs):

- ``default``: FA4's grid (KV block, head, batch), KV block fastest: the KV blocks of one head after
  another, so the heaviest CTAs of the last heads start late;
- ``lpt``: the same CTAs heaviest first (KV block slowest);
- ``head_loop``: one CTA per (KV block, KV head, batch) running the GQA group's query heads (4x the
  work each), heaviest first;
- ``l2_sections``: heaviest first within sections of 8 consecutive (batch, head) pairs, the sections in
  grid order: flash-attn-4's ``SingleTileLPTBwdScheduler`` at S4096 D128 (``bwd_sm90``'s sections).

A model, not a measurement: CTAs of equal work take equal time here, memory and L2 effects are left
out. The H200 refuted what it predicts: both orders were built as options of the CuTe backward
(96276f8, 4520c55) and lost at B4 H32/8 S4096 causal, the backward alone 2.89 ms by default against
3.16 with ``head_loop`` and forward + backward 3.78-3.94 against 5.77 with ``lpt``
(``results/session_2026-12-05b_h200/``); they were deleted. Heaviest first over all heads puts the
first KV block of 132 different heads on the GPU at once, each streaming its own head's Q and dO and
adding into its own head's dQ, where FA4's order keeps about four heads in flight (a likely cause,
not profiled). ``head_loop`` as built always ran heaviest first; the group loop in FA4's order lost
too (results/session_2026-12-06c_h100). ``l2_sections`` keeps 8 heads in flight and is the causal
backward's order since 2026-12-06; on the H100 it gained 1.5-4.7% at B1 and -1..+2% at B4, not the
model's 14% / 3.5% (results/session_2026-12-06c_h100).
"""

from __future__ import annotations

import argparse
import heapq
import json
from pathlib import Path

SHAPES = ((1, 32, 8), (2, 32, 8), (4, 32, 8), (8, 32, 8))  # (B, Hq, Hkv) at head dim 128, causal


def makespan(durations: list[float], sms: int) -> float:
    """Greedy list scheduling in the given order: each job starts on the SM that frees first."""
    free = [0.0] * sms
    end = 0.0
    for d in durations:
        t = heapq.heappop(free)
        heapq.heappush(free, t + d)
        end = max(end, t + d)
    return end


def orders(b: int, hq: int, hkv: int, n_blocks: int, overhead: float) -> dict[str, list[float]]:
    """CTA durations (in 64-query steps) in each launch order."""
    group = hq // hkv

    def work(n: int, heads: int) -> float:
        return heads * 2 * (n_blocks - n) + overhead

    default = [work(n, 1) for _ in range(b) for _ in range(hq) for n in range(n_blocks)]
    lpt = [work(n, 1) for n in range(n_blocks) for _ in range(b) for _ in range(hq)]
    head_loop = [work(n, group) for n in range(n_blocks) for _ in range(b) for _ in range(hkv)]
    sections = [min(8, b * hq - s) for s in range(0, b * hq, 8)]
    l2_sections = [work(n, 1) for size in sections for n in range(n_blocks) for _ in range(size)]
    return {"default": default, "lpt": lpt, "head_loop": head_loop, "l2_sections": l2_sections}


def model(sms: int, seq: int, overheads: list[float]) -> list[dict]:
    """One row per (shape, overhead): each order's makespan over the balanced time of its work."""
    n_blocks = seq // 128
    rows = []
    for b, hq, hkv in SHAPES:
        for overhead in overheads:
            row = {"B": b, "Hq": hq, "Hkv": hkv, "S": seq, "overhead": overhead}
            for name, durations in orders(b, hq, hkv, n_blocks, overhead).items():
                row[name] = round(makespan(durations, sms) / (sum(durations) / sms), 4)
            rows.append(row)
    return rows


def to_markdown(rows: list[dict], sms: int) -> str:
    lines = [
        f"# Causal backward launch orders on {sms} SMs (greedy model, makespan / balanced time)",
        "",
        "| shape | overhead per CTA (query blocks) | default | lpt | head_loop | l2_sections |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| B{r['B']} H{r['Hq']}/{r['Hkv']} S{r['S']} causal | {r['overhead']:g} | {r['default']:.3f} "
            f"| {r['lpt']:.3f} | {r['head_loop']:.3f} | {r['l2_sections']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--overhead", type=float, nargs="+", default=[0.0, 2.0])
    p.add_argument("--out", help="write PREFIX.json and PREFIX.md")
    a = p.parse_args(argv)
    if a.seq % 128 or a.seq <= 0:
        raise SystemExit(f"bwd_schedule_model: --seq must be a positive multiple of 128, got {a.seq}")
    rows = model(a.sms, a.seq, a.overhead)
    md = to_markdown(rows, a.sms)
    print(md)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{a.out}.json").write_text(json.dumps({"sms": a.sms, "rows": rows}, indent=1) + "\n")
        Path(f"{a.out}.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
