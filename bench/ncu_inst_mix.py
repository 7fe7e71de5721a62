"""Executed instructions by opcode from Nsight Compute's SASS page, for one kernel or two side by side.

    python bench/ncu_inst_mix.py A.sass.csv[.gz] [B.sass.csv[.gz]] [--top 22] [--unit-op MUFU]

The input is ``ncu -i REP --page source --csv --print-source sass`` (``bench/cute_session.sh``'s
profile step writes it as ``prof_<variant>.sass.csv``), plain or gzipped. Per opcode (the SASS
mnemonic without its modifiers or predicate): warp-level instructions executed (millions), their
share of the kernel's, and the share of warp-stall samples taken at them. ``--unit-op`` expresses
each count in units of that opcode's count in the first file (MUFU in an attention kernel: about
one exp2 per score element, so the units are instructions per score element).
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import re
import sys

OPCODE = re.compile(r"^(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def sass_page(path: str) -> tuple[list[str], list[list[str]]]:
    """``(header, rows below it)`` of the SASS page CSV at ``path`` (plain or gzipped), read whole.

    Raises:
        ValueError: the file has no ``Source`` / ``Instructions Executed`` header (not a SASS page).
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(io.StringIO(f.read())))
    head = next((i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r), None)
    if head is None:
        raise ValueError(f"{path}: no 'Source' and 'Instructions Executed' columns: not an ncu SASS page CSV")
    return rows[head], rows[head + 1 :]


def instruction_mix(path: str) -> tuple[collections.Counter, collections.Counter]:
    """(executed warp instructions, warp-stall samples) per opcode of the SASS CSV at ``path``.

    Raises:
        ValueError: the file has no ``Source`` / ``Instructions Executed`` header (not a SASS page).
    """
    h, rows = sass_page(path)
    i_src, i_exe = h.index("Source"), h.index("Instructions Executed")
    stall_col = "Warp Stall Sampling (All Samples)"
    i_stall = h.index(stall_col) if stall_col in h else None
    executed, stalls = collections.Counter(), collections.Counter()
    for r in rows:
        if len(r) <= i_exe:
            continue
        m = OPCODE.match(r[i_src].strip())
        try:
            n = int(r[i_exe].replace(",", ""))
        except ValueError:
            continue
        if m:
            executed[m.group(1)] += n
            if i_stall is not None:
                stalls[m.group(1)] += int(r[i_stall].replace(",", "") or 0)
    return executed, stalls


def report(paths: list[str], top: int = 22, unit_op: str | None = None) -> str:
    """The markdown table of ``instruction_mix`` for each path (opcodes by the first file's counts)."""
    mixes = [instruction_mix(p) for p in paths]
    unit = mixes[0][0].get(unit_op) if unit_op else None
    if unit_op and not unit:
        raise ValueError(f"--unit-op {unit_op}: the first file executes no {unit_op}")
    cols = []
    for i, _ in enumerate(paths):
        cols += [f"M inst [{i}]", f"% [{i}]", f"% stalls [{i}]"] + ([f"per {unit_op} [{i}]"] if unit else [])
    lines = [" ".join(f"[{i}] = {p}" for i, p in enumerate(paths)), ""]
    lines.append("| opcode | " + " | ".join(cols) + " |")
    lines.append("|---" * (len(cols) + 1) + "|")
    totals = [(sum(e.values()), sum(s.values()) or 1) for e, s in mixes]
    order = [op for op, _ in mixes[0][0].most_common(top)]
    for op in order + ["(all)"]:
        cells = []
        for (e, s), (te, ts) in zip(mixes, totals):
            n = te if op == "(all)" else e.get(op, 0)
            st = ts if op == "(all)" else s.get(op, 0)
            cells += [f"{n / 1e6:.1f}", f"{100 * n / te:.1f}", f"{100 * st / ts:.1f}"]
            if unit:
                cells.append(f"{n / unit:.2f}")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="ncu SASS page CSVs (.csv or .csv.gz)")
    p.add_argument("--top", type=int, default=22, help="opcodes shown, by the first file's counts")
    p.add_argument("--unit-op", default=None, help="also in units of this opcode's count in the first file")
    args = p.parse_args(argv)
    sys.stdout.write(report(args.paths, args.top, args.unit_op))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
