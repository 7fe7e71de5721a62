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


# the forward's KV-tile loop in program order, split at these anchors (``loop_regions``)
FWD_REGIONS = (
    "K scales, K wait",
    "QK issue",
    "QK wait",
    "scale, mask, row max",
    "exp, row sum, E4M3 pack",
    "V wait, turn",
    "PV issue",
    "PV wait",
    "PV promotion",
)


def loop_regions(path: str, loop_exe: int | None = None) -> list[tuple[str, int]]:
    """The CuTe fp8 forward's unmasked KV-tile loop (the instructions executed ``loop_exe`` times,
    default the largest count shared by 100 or more) split into :data:`FWD_REGIONS`, with the stall
    samples of each: the loop's first GMMA (QK issue) to its wait (``WARPGROUP.DEPBAR``), the
    first ``MUFU`` after it (the exponentials), the branch before the turn's ``BAR.SYNC`` (V's
    barrier wait, then the turn), the second GMMA run (PV) and its wait, the rest (promotion).

    Raises:
        ValueError: the loop lacks one of the anchors (not the forward's loop).
    """
    ins = load(path)
    if loop_exe is None:
        counts = collections.Counter(x[2] for x in ins if x[2] > 0)
        loop_exe = max(e for e, n in counts.items() if n >= 100)
    body = [x for x in ins if x[2] == loop_exe]
    ops = [OPCODE.match(x[0]).group(1) if OPCODE.match(x[0]) else "" for x in body]

    def first(pred, start=0):
        for i in range(start, len(ops)):
            if pred(ops[i]):
                return i
        raise ValueError(f"{path}: no loop anchor after instruction {start} (not the fp8 forward's loop?)")

    g1 = first(lambda o: "GMMA" in o)
    d1 = first(lambda o: o.startswith("WARPGROUP.DEPBAR"), g1)
    m1 = first(lambda o: o.startswith("MUFU"), d1)
    bar = first(lambda o: o.startswith("BAR.SYNC"), m1)
    b1 = max(i for i in range(m1, bar) if ops[i] == "BRA")
    g2 = first(lambda o: "GMMA" in o, bar)
    d2 = first(lambda o: o.startswith("WARPGROUP.DEPBAR"), g2)
    cuts = [0, g1, d1, d1 + 1, m1, b1, g2, d2, d2 + 1, len(body)]
    return [(name, sum(x[1] for x in body[a:b])) for name, a, b in zip(FWD_REGIONS, cuts, cuts[1:])]


def regions_report(path: str, cycles_per_tile: float | None, loop_exe: int | None) -> str:
    """:func:`loop_regions` as shares of the loop's samples and, given the cycles per KV tile of a
    consumer warpgroup (elapsed cycles per SM / tiles per SM: samples are uniform in time), cycles."""
    regions = loop_regions(path, loop_exe)
    total = sum(n for _, n in regions) or 1
    lines = [f"== {path}: the KV-tile loop by region ({total} samples)"]
    for name, n in regions:
        cyc = f"  {n / total * cycles_per_tile:7.0f} cycles" if cycles_per_tile else ""
        lines.append(f"  {name:26s} {n / total:6.1%}{cyc}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--top", type=int, default=28)
    ap.add_argument("--min-share", type=float, default=0.008)
    ap.add_argument("--loop-exe", type=int, default=None)
    ap.add_argument("--smem-steps", type=int, default=None)
    ap.add_argument("--regions", action="store_true", help="the fp8 forward's KV-tile loop by region")
    ap.add_argument("--cycles-per-tile", type=float, default=None, help="with --regions: cycles per KV tile")
    args = ap.parse_args()
    for path in args.files:
        if args.regions:
            print(regions_report(path, args.cycles_per_tile, args.loop_exe))
        elif args.smem_steps:
            by_op = shared_by_opcode(path)
            print(f"== {path}: shared-memory traffic, KiB per step ({args.smem_steps} steps)")
            for op, wf in by_op.most_common():
                print(f"  {op:24s} {wf * 128 / args.smem_steps / 1024:7.1f}")
            print(f"  {'(all)':24s} {sum(by_op.values()) * 128 / args.smem_steps / 1024:7.1f}")
        else:
            print(report(path, args.top, args.min_share, args.loop_exe))


if __name__ == "__main__":
    main()
