"""The SM clock and power the rows of ``bench/attention_bench.py`` ran at, from the nvidia-smi samples
``bench/cute_session.sh`` takes beside the bench (``bench_clocks.csv``: every 200 ms, ``--query-gpu=
timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active``).

    python bench/bench_clocks.py LOGDIR [--out NAME]       # LOGDIR: bench.log and bench_clocks.csv

Windows: a row's own ``t_unix`` (the Unix seconds its timing ran between, in the rows since
attention_bench recorded them; one window per round with its ``--rounds``) or, for older rows, its
(shape, pass) group's: ``bench.log`` prefixes each printed line with the Unix second it was printed,
and a group's rows are printed together once the group is done, so a group ran between the previous
group's print and its own. For each window:
the row's time in it (ms; none for a group), the samples in it with the GPU busy (power above
``--busy-watts``, default 150 W), their median and
lowest SM clock (MHz), highest power (W) and temperature (C), and the fraction of them with the
software power cap among the active clock-event reasons (bit 0x4 of nvidia-smi's
``clocks_event_reasons.active``: the driver lowered the clocks to hold the board's power limit).
Nothing here changes a setting of the GPU (``device/METHOD.md``: measure the card as found).

The samples' timestamps are read as UTC: ``cute_session.sh`` runs nvidia-smi with ``TZ=UTC`` on GPU 0
(the bench's device; the session of 2026-12-05 ran before that, on a machine whose clock was UTC).
The group windows of older logs are approximate: two groups printed within one second share a
window (under the first one's label), and consecutive windows overlap by up to a second.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import statistics
import sys
from pathlib import Path

SW_POWER_CAP = 0x4  # nvidia-smi clocks_event_reasons bit: "SW Power Cap"


def read_samples(path: Path) -> list[tuple[float, int, float, int, int]]:
    """``(unix seconds, SM MHz, W, C, reasons)`` per line of an nvidia-smi CSV (header first; lines that
    do not parse, such as a cut last line, are skipped)."""
    out = []
    with open(path, newline="") as f:
        rows = csv.reader(f)
        next(rows, None)
        for r in rows:
            try:
                t = _dt.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=_dt.UTC)
                out.append(
                    (
                        t.timestamp(),
                        int(r[1].split()[0]),
                        float(r[3].split()[0]),
                        int(r[4]),
                        int(r[5].strip(), 16),
                    )
                )
            except (ValueError, IndexError):
                continue
    return out


def read_rows(log: Path) -> list[tuple[int, dict]]:
    """``(printed at, record)`` of each JSON row of a ``bench.log`` whose lines carry a Unix-second prefix."""
    out = []
    for line in log.read_text().splitlines():
        head, _, rest = line.partition(" ")
        if head.isdigit() and rest.startswith("{"):
            out.append((int(head), json.loads(rest)))
    return out


def windows(rows: list[tuple[int, dict]]) -> list[tuple[str, float, float, list[dict], float | None]]:
    """``(label, start, end, records, ms)``: one per row (and round) with ``t_unix``, with the row's
    time in that round; else one per printed group (no time)."""
    if rows and all("t_unix" in r or "error" in r for _, r in rows):
        out = []
        for _, r in rows:
            spans = r.get("t_unix", [])
            spans = [spans] if spans and not isinstance(spans[0], list) else spans  # one round: [t0, t1]
            times = r.get("ms_rounds", [r.get("ms")])
            for i, (t0, t1) in enumerate(spans):
                tag = f" #{i}" if len(spans) > 1 else ""  # attention_bench --rounds: one window per round
                ms = times[i] if i < len(times) else None
                out.append((f"{r['shape']} {r['pass']} {r['impl']}{tag}", t0, t1, [r], ms))
        return out
    out, start = [], None
    for t in sorted({t for t, _ in rows}):
        group = [r for tt, r in rows if tt == t]
        if start is not None:  # the first group's start is not known: its window is left out
            out.append((f"{group[0]['shape']} {group[0]['pass']}", start, t + 1.0, group, None))
        start = t
    return out


def summarize(samples, lo: float, hi: float, busy_watts: float) -> dict:
    """The samples in ``[lo, hi)`` with power above ``busy_watts``: clocks, power, temperature, the
    fraction under the software power cap."""
    busy = [s for s in samples if lo <= s[0] < hi and s[2] > busy_watts]
    if not busy:
        return {"samples": 0}
    return {
        "samples": len(busy),
        "sm_mhz_median": statistics.median(s[1] for s in busy),
        "sm_mhz_min": min(s[1] for s in busy),
        "watts_max": max(s[2] for s in busy),
        "temp_max": max(s[3] for s in busy),
        "sw_power_cap_fraction": round(sum(bool(s[4] & SW_POWER_CAP) for s in busy) / len(busy), 2),
    }


def report(logdir: Path, busy_watts: float = 150.0) -> list[dict]:
    samples = read_samples(logdir / "bench_clocks.csv")
    return [
        {
            "window": label,
            "t0": lo,
            "t1": hi,
            "rows": [r["impl"] for r in recs],
            "ms": ms,
            **summarize(samples, lo, hi, busy_watts),
        }
        for label, lo, hi, recs, ms in windows(read_rows(logdir / "bench.log"))
    ]


def to_markdown(out: list[dict]) -> str:
    lines = [
        "| window | ms | busy samples | SM MHz median | SM MHz min | W max | C max | SW power cap |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in out:
        ms = "" if w.get("ms") is None else f"{w['ms']:.3f}"
        if not w["samples"]:
            lines.append(f"| {w['window']} | {ms} | 0 | | | | | |")
            continue
        lines.append(
            f"| {w['window']} | {ms} | {w['samples']} | {w['sm_mhz_median']:.0f} | {w['sm_mhz_min']} "
            f"| {w['watts_max']:.0f} | {w['temp_max']} | {w['sw_power_cap_fraction']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logdir", type=Path, help="a folder with bench.log and bench_clocks.csv")
    p.add_argument("--busy-watts", type=float, default=150.0)
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    a = p.parse_args(argv)
    for name in ("bench.log", "bench_clocks.csv"):
        if not (a.logdir / name).is_file():
            print(f"bench_clocks: {a.logdir / name} not found", file=sys.stderr)
            return 2
    out = report(a.logdir, a.busy_watts)
    md = to_markdown(out)
    if a.out:
        Path(a.out + ".json").write_text(json.dumps(out, indent=1) + "\n")
        Path(a.out + ".md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
