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
import re

from ncu_inst_mix import sass_page

OPCODE = re.compile(r"^(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.x]*)")


def _rows(path: str) -> tuple[list[str], list[list[str]]]:
    """The SASS page's header and its complete rows (``ncu_inst_mix.sass_page``)."""
    h, rows = sass_page(path)
    return h, [r for r in rows if len(r) == len(h)]


def _num(text: str) -> int:
    return int(text.replace(",", "") or 0)


def shared_by_opcode(path: str) -> collections.Counter:
    """Shared-memory wavefronts (128 B each) per opcode with its shape suffix (``HGMMA.64x64x16``...)."""
    h, rows = _rows(path)
    i_src, i_wf = h.index("Source"), h.index("L1 Wavefronts Shared")
    out = collections.Counter()
    for r in rows:
        wf = _num(r[i_wf])
        m = OPCODE.match(r[i_src].strip())
        if wf and m:
            op = m.group(1)
            out[".".join(op.split(".")[:2]) if "GMMA" in op else op.split(".")[0]] += wf
    return out


def load(path: str) -> list[tuple[str, int, int, dict[str, int]]]:
    """(source, stall samples, warp instructions executed, samples by reason) per SASS instruction.

    Raises:
        ValueError: the file has no ``Source`` / ``Instructions Executed`` header (not a SASS page).
    """
    h, rows = _rows(path)
    reasons = [c for c in h if c.startswith("stall_") and "Not Issued" not in c]
    out = []
    for r in rows:
        d = dict(zip(h, r))
        out.append(
            (
                d["Source"].strip(),
                _num(d["Warp Stall Sampling (All Samples)"]),
                _num(d["Instructions Executed"]),
                {c[len("stall_") :]: _num(d[c]) for c in reasons},
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
    ap.add_argument("--smem-steps", type=int, default=None)
    args = ap.parse_args()
    for path in args.files:
        if args.smem_steps:
            by_op = shared_by_opcode(path)
            print(f"== {path}: shared-memory traffic, KiB per step ({args.smem_steps} steps)")
            for op, wf in by_op.most_common():
                print(f"  {op:24s} {wf * 128 / args.smem_steps / 1024:7.1f}")
            print(f"  {'(all)':24s} {sum(by_op.values()) * 128 / args.smem_steps / 1024:7.1f}")
        else:
            print(report(path, args.top, args.min_share, args.loop_exe))


if __name__ == "__main__":
    main()
