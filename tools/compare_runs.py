"""Compare a BF16 pretraining run with low-precision runs trained on identical data.

    python tools/compare_runs.py RUN [RUN ...] --out runs/compare_x [--windows 10]

Each RUN is a run directory with ``metrics.jsonl`` and ``run_meta.json``. Runs are grouped into
arms by precision (attention recipe, its Q/K rotation, projection); several seeds per arm are
allowed. All runs must share the config fingerprint (else refused, naming the config keys that
differ and their values) and the data-order fingerprint, must not hold steps trained before a config
change allowed at a resume (``allowed_changes`` of the resume event, which ``run_meta.json``, the
last launch's, does not show) nor a logged learning rate that differs from the others' (``--force``
compares anyway and says so)
and log train/validation records at exactly the same consumed-token counts (else refused with the
reason -- never interpolated, also with ``--force``; ``--max-tokens`` cuts every run to a common
range).

Per token window and per non-baseline arm it reports the train-loss and validation-loss gap to the
baseline (nats, arm - baseline) with percentile bootstrap intervals (a window of fewer than 5
points, such as the final validation gap: the t interval over the seeds' window means, paired or
Welch's; tools/runcompare/analysis.py), the first window whose
interval excludes 0, non-finite counts and the median tokens/s/GPU ratio; per arm with >= 2 seeds
the seed spread (s.d. and range of the seeds' window means); per non-baseline arm with >= 2 seeds on
both sides, the resolution of the design: the t interval of the final validation gap over the
seeds, paired where both arms hold the same seeds (the README's design: the runs of a seed share
initial weights and data) and Welch's otherwise (its half-width is the smallest gap those seeds
resolve), and whether the arm is statistically indistinguishable from the baseline
(tools/runcompare/welch.py). Runs of one arm only (several seeds)
give the seed spread alone. Runs that ran on a CPU (``mfu`` null) get their throughput flagged:
on a CPU shared with other work a tokens/s ratio means nothing. It writes ``summary.md``,
``summary.json``, ``loss_vs_tokens.png`` and (with two arms or more) ``gap_vs_tokens.png`` to
``--out``; a loss point outside the zoomed axes is marked at the edge of the plot.

Bootstrap (``--bootstrap``): ``auto`` = ``hier`` when both arms have >= 2 seeds (seeds resampled per
arm plus paired circular blocks of steps), else ``blocks`` (paired circular blocks of steps, block
length chosen automatically). ``seeds`` = seeds only. Where both arms hold the same seeds, the seeds
are resampled in pairs (reported as ``hier-paired``, ``seeds-paired``). See tools/runcompare/stats.py.

Exit status: 0 on success, 2 when runs are refused or unreadable (reasons on stderr).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # training.fingerprint (no torch)

from runcompare.analysis import Options, compare
from runcompare.runs import CompareError


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _ci_level(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1), e.g. 0.95; got {s!r}") from None
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), e.g. 0.95; got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="compare_runs.py",
        description="Compare precision arms of pretraining runs on identical data (loss gaps with "
        "bootstrap intervals, validation gap, non-finite counts, throughput ratio).",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (metrics.jsonl + run_meta.json)")
    p.add_argument(
        "--out",
        type=Path,
        help="output directory (summary.md, summary.json, PNGs); without it the markdown goes to stdout",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--windows", type=_positive_int, default=10, help="number of equal token windows (default 10)"
    )
    g.add_argument("--window-tokens", type=_positive_int, help="window width in tokens ([0,T), [T,2T), ...)")
    p.add_argument(
        "--baseline",
        help="baseline arm: its label (attn=R,proj=P) or attention recipe (default: attn=bf16,proj=bf16)",
    )
    p.add_argument("--ci", type=_ci_level, default=0.95, help="interval level (default 0.95)")
    p.add_argument("--n-boot", type=_positive_int, default=2000, help="bootstrap replicates (default 2000)")
    p.add_argument("--bootstrap-seed", type=int, default=0, help="RNG seed of the bootstrap (default 0)")
    p.add_argument(
        "--bootstrap",
        choices=("auto", "hier", "seeds", "blocks"),
        default="auto",
        help="resampling: auto (hier with >=2 seeds per arm, else blocks), hier, seeds, blocks; seeds are "
        "resampled in pairs where both arms hold the same seeds",
    )
    p.add_argument(
        "--block-len", type=_positive_int, help="block length in logged steps (default: automatic)"
    )
    p.add_argument(
        "--max-tokens", type=_positive_int, help="compare only records with consumed_tokens <= this"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="compare despite differing config/data-order "
        "fingerprints or repeated seeds (reported as warnings); never interpolates grids",
    )
    p.add_argument(
        "--skip-malformed",
        action="store_true",
        help="skip (and count) malformed metrics lines instead of refusing",
    )
    p.add_argument("--no-plots", action="store_true", help="do not write the PNG plots")
    return p


def _tool_commit() -> tuple[str | None, bool | None]:
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], check=False, cwd=here, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None, None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            check=False,
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip(), bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None, None


def _check_out(out: Path) -> None:
    """Refuse an ``--out`` that cannot become a writable directory, before the comparison runs."""
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                raise CompareError(f"--out {out}: {p} is a file, not a directory; name another --out")
            if not os.access(p, os.W_OK):
                raise CompareError(f"--out {out}: {p} is not writable; name another --out")
            return


def run(argv: list[str], *, prog: str = "tools/compare_runs.py") -> dict:
    """Run the comparison for the CLI arguments ``argv`` and write the outputs; returns the result
    dict (see runcompare.analysis.compare). Raises CompareError when the runs are refused."""
    args = build_parser().parse_args(argv)
    if args.out is not None:
        _check_out(args.out)
    opt = Options(
        windows=args.windows,
        window_tokens=args.window_tokens,
        ci=args.ci,
        n_boot=args.n_boot,
        bootstrap_seed=args.bootstrap_seed,
        bootstrap=args.bootstrap,
        block_len=args.block_len,
        baseline=args.baseline,
        max_tokens=args.max_tokens,
        force=args.force,
        skip_malformed=args.skip_malformed,
    )
    res = compare(args.runs, opt)
    commit, dirty = _tool_commit()
    res["tool"] = {
        "command": shlex.join(["python", prog, *argv]),
        "cwd": os.getcwd(),
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "dirty": dirty,
    }
    res["options"] = {k: getattr(opt, k) for k in opt.__dataclass_fields__}

    from runcompare.report import render_markdown, write_json

    md = render_markdown(res)
    if args.out is None:
        sys.stdout.write(md)
        return res
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CompareError(f"--out {args.out}: cannot create the directory ({e.strerror})") from None
    if not args.no_plots:
        from runcompare.plots import plot_gaps, plot_losses

        plot_losses(res, args.out / "loss_vs_tokens.png")
        md += "\n## Plots\n\n![loss vs tokens](loss_vs_tokens.png)\n"
        if res["comparisons"]:
            plot_gaps(res, args.out / "gap_vs_tokens.png")
            md += "\n![gap vs tokens](gap_vs_tokens.png)\n"
    (args.out / "summary.md").write_text(md, encoding="utf-8")
    write_json(res, args.out / "summary.json")
    return res


def main(argv: list[str] | None = None) -> int:
    prog = "tools/compare_runs.py"
    if argv is None:
        argv, prog = sys.argv[1:], sys.argv[0]
    try:
        res = run(argv, prog=prog)
    except CompareError as e:
        print(f"compare_runs: {e}", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    if args.out is not None:
        plots = (
            ""
            if args.no_plots
            else ", loss_vs_tokens.png" + (", gap_vs_tokens.png" if res["comparisons"] else "")
        )
        print(f"compare_runs: wrote {args.out}/summary.md, summary.json{plots}")
    for w in res["warnings"]:
        print(f"compare_runs: warning: {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
