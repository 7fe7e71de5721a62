"""Warp-stall samples per SASS instruction from Nsight Compute's source page, for one or more kernels.

    python bench/ncu_stalls.py A.sass.csv[.gz] [B.sass.csv[.gz] ...] [--top 28] [--min-share 0.008]

The input is ``ncu -i REP --page source --csv --print-source sass`` (``bench/ncu_light.sh`` writes it
gzipped). Per file: the share of all stall samples by reason, the instructions holding the largest
shares (index in the SASS listing, share, dominant reason, warp instructions executed, source), and
the same restricted to the consumer warpgroups' main loop, recognized by its execution count: the
largest count shared by at least 100 instructions (``--loop-exe`` to give it; a count and its half
are both taken, so that a branch per warpgroup is included).
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io


def load(path: str) -> list[tuple[str, int, int, dict[str, int]]]:
    """(source, stall samples, warp instructions executed, samples by reason) per SASS instruction.

    Raises:
        ValueError: the file has no ``Source`` / ``Instructions Executed`` header (not a SASS page).
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(io.StringIO(f.read())))
    head = next((i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r), None)
    if head is None:
        raise ValueError(f"{path}: no 'Source' and 'Instructions Executed' columns: not an ncu SASS page CSV")
    h = rows[head]
    reasons = [c for c in h if c.startswith("stall_") and "Not Issued" not in c]

    def num(text: str) -> int:
        return int(text.replace(",", "") or 0)

    out = []
    for r in rows[head + 1 :]:
        if len(r) != len(h):
            continue
        d = dict(zip(h, r))
        out.append(
            (
                d["Source"].strip(),
                num(d["Warp Stall Sampling (All Samples)"]),
                num(d["Instructions Executed"]),
                {c[len("stall_") :]: num(d[c]) for c in reasons},
            )
        )
    return out


def report(path: str, top: int, min_share: float, loop_exe: int | None) -> str:
    ins = load(path)
    total = sum(x[1] for x in ins) or 1
    by_reason = collections.Counter()
    for x in ins:
        by_reason.update(x[3])
    lines = [f"== {path}: {total} stall samples"]
    lines.append("  by reason: " + ", ".join(f"{k} {v / total:.1%}" for k, v in by_reason.most_common(9)))
    if loop_exe is None:
        counts = collections.Counter(x[2] for x in ins if x[2] > 0)
        loop_exe = max(e for e, n in counts.items() if n >= 100)
    loop = [(i, x) for i, x in enumerate(ins) if x[2] in (loop_exe, loop_exe // 2)]
    in_loop = sum(x[1] for _, x in loop)
    share = in_loop / total
    lines.append(f"  main loop (executed {loop_exe} or {loop_exe // 2} times): {share:.1%} of the samples")
    lines.append(f"  instructions with >= {min_share:.1%} of all samples (loop only):")
    for i, (src, n, exe, rs) in loop:
        if n / total >= min_share:
            lines.append(f"    {i:5d} {n / total:6.1%} {max(rs, key=rs.get):12s} exe={exe:9d} {src[:72]}")
    lines.append(f"  top {top} instructions anywhere:")
    for i in sorted(sorted(range(len(ins)), key=lambda k: -ins[k][1])[:top]):
        src, n, exe, rs = ins[i]
        lines.append(f"    {i:5d} {n / total:6.1%} {max(rs, key=rs.get):12s} exe={exe:9d} {src[:72]}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=28)
    ap.add_argument("--min-share", type=float, default=0.008)
    ap.add_argument("--loop-exe", type=int, default=None)
    args = ap.parse_args()
    for path in args.files:
        print(report(path, args.top, args.min_share, args.loop_exe))


if __name__ == "__main__":
    main()
