"""Training throughput of the Llama-3.1-8B layer shape on one GPU: BF16 vs low-precision attention.

    python3 bench/train_throughput.py --out results/train_throughput_h200      # ~5-6 min on one H200
    python3 bench/train_throughput.py --dry-run                                  # the commands; no GPU
    python3 bench/train_throughput.py --budget-s 520 --out $OUT/train_throughput_h200   # in one 10-min window

Every (arm, micro-batch) is its own ``pretrain_llama.py`` process, one after the other: the 8B
recipe with ``model.num_layers=L`` (default 12: what fits one H200), sequence 4096, micro-batch 1, 2,
4 with no accumulation, no checkpoints, 3 warm-up + 6 timed steps. Arms: ``bf16``, ``fp8``,
``nvfp4qk_fp8pv`` attention with BF16 projections, plus ``bf16+te_fp8`` and ``nvfp4qk_fp8pv+te_fp8``
when Transformer Engine imports. Per run: median step time of the timed steps, tokens/s/GPU, MFU,
peak memory, the last loss; per recipe, the attention alone at the training shape (its share of a
step); per arm, the step time extrapolated to 32 layers from a second run at
``--extrapolate-from-layers`` layers, and a 64-GPU estimate from it.

Order (what matters most first, for a benchmark cut short): the main runs at the largest
micro-batch, the extrapolation runs, then the other micro-batches. ``--budget-s`` skips runs that
would start too late; a SIGTERM to the benchmark (e.g. from ``timeout``) stops the running child and
writes what was measured.

Outputs (``--out PREFIX``): ``PREFIX.json`` (one record per run with every number, the exact command
and the tail of the log of a failed run; metadata: date UTC, GPU, torch / triton / megatron-core
versions, git commit (``$BENCH_COMMIT`` overrides), L) and ``PREFIX.md`` (tables, the throughput and
memory targets with PASS/MISS, the extrapolation), both rewritten after every run. A failed run (out
of memory, non-zero exit, timeout, missing steps, non-finite loss) is recorded and the others go on;
the exit code is 1 if a run or the attention timing of a recipe failed. The markdown report is
printed last, its runs table at the end.

The benchmark itself is the package ``bench/throughput/``; each module's docstring says how its part
is done: ``plan.py`` (the runs, their overrides, why 12 layers fit), ``process.py`` (the child
processes), ``attention.py`` (the attention share), ``analysis.py`` (the numbers per run, the MFU
formula, the extrapolation and its assumptions), ``report.py`` (the outputs), ``runner.py`` (the
order, the budget, a stop).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import warnings
from pathlib import Path

from throughput import REPO
from throughput.attention import time_attention
from throughput.plan import (
    ARMS,
    BASE_CONFIG,
    BASELINE,
    TE_ARMS,
    plan_runs,
    transformer_engine_status,
    validate_runs,
)
from throughput.process import sigterm_raises_terminated
from throughput.report import metadata, plan_metadata
from throughput.runner import measure

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see ``--help``); exits with a usage error for impossible values."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    p.add_argument("--out", help="output prefix: writes PREFIX.json and PREFIX.md (after every run)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the commands; run nothing")
    p.add_argument("--layers", type=int, default=12, help="model.num_layers of the main runs (default 12)")
    p.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument(
        "--arms",
        nargs="+",
        choices=[*ARMS, *TE_ARMS],
        default=None,
        help=f"default: {', '.join(ARMS)}, plus {', '.join(TE_ARMS)} when Transformer Engine imports",
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of each run (default 3)")
    p.add_argument("--timed", type=int, default=6, help="timed steps after the warm-up (default 6)")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument(
        "--extrapolate-from-layers",
        type=int,
        default=4,
        help="second layer count for the 32-layer extrapolation, at the largest micro-batch (0 = off)",
    )
    p.add_argument(
        "--dp-efficiency",
        type=float,
        default=0.95,
        help="ASSUMED data-parallel efficiency for the 64-GPU estimate (default 0.95)",
    )
    p.add_argument("--timeout", type=float, default=150, help="seconds per training run (default 150)")
    p.add_argument("--attention-timeout", type=float, default=180, help="seconds for the attention timing")
    p.add_argument(
        "--budget-s",
        type=float,
        default=0,
        help="wall-clock budget of the whole benchmark: runs that would start after it are "
        "skipped (reported as failed) and timeouts shrink to fit (0 = none)",
    )
    p.add_argument(
        "--run-dir",
        default=str(REPO / "runs" / "train_throughput"),
        help="run directories and logs of the training processes",
    )
    p.add_argument(
        "--config", default=BASE_CONFIG, help=f"base config, relative to the repo (default {BASE_CONFIG})"
    )
    p.add_argument(
        "--override",
        nargs="+",
        default=[],
        metavar="section.key=value",
        help="extra overrides appended to every run (they win), e.g. data.cache_dir=/scratch/data",
    )
    p.add_argument("--no-attention-timing", action="store_true", help="skip the attention-alone timing")
    # internal: the attention timing child process
    p.add_argument("--attention-timing-json", help=argparse.SUPPRESS)
    p.add_argument("--attention-recipes", nargs="+", default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.warmup < 1 or args.timed < 1 or args.layers < 1 or min(args.micro_batches) < 1:
        p.error("--warmup, --timed, --layers and --micro-batches must be >= 1")
    if args.extrapolate_from_layers < 0 or not 0 < args.dp_efficiency <= 1:
        p.error("--extrapolate-from-layers must be >= 0 and --dp-efficiency in (0, 1]")
    args.micro_batches = sorted(set(args.micro_batches))
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit code: 0 all ran, 1 something failed, 2 an invalid run config."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.attention_timing_json:  # the child process of throughput.attention.run_attention_timing
        recs = time_attention(args.attention_recipes, args.micro_batches, seq=args.seq)
        Path(args.attention_timing_json).write_text(json.dumps(recs, indent=1))
        return 0
    t_start = time.perf_counter()
    # megatron-core warns at import about optional packages (TE, Apex); each run's log says what it uses
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.core\..*")
    te_ok, te_note = transformer_engine_status()
    print(te_note, flush=True)
    if args.arms is None:
        args.arms = [*ARMS, *(TE_ARMS if te_ok else ())]
    elif BASELINE not in args.arms:
        args.arms = [BASELINE, *args.arms]  # every ratio is against the bf16 arm
    specs = plan_runs(args)
    try:
        validate_runs(specs, args.config)
    except ValueError as err:
        print(f"train_throughput: {err}", file=sys.stderr)
        return 2
    for i, s in enumerate(specs, 1):
        print(
            f"[{i}/{len(specs)}] {s.name} ({s.purpose}; plan estimate "
            f"{s.plan['memory_estimate_gib']:.1f} GiB, {s.plan['parameters'] / 1e9:.2f}B parameters): "
            f"{shlex.join(s.argv)}",
            flush=True,
        )
    if args.dry_run:
        return 0
    meta = {**metadata(args, te_note), **plan_metadata(next(s for s in specs if s.purpose == "main"))}
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    with sigterm_raises_terminated():
        return measure(args, specs, meta, t_start)


if __name__ == "__main__":
    raise SystemExit(main())
