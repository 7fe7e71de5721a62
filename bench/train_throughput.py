"""Training throughput of the Llama-3.1-8B layer shape on one GPU: the BF16 stack vs low precision.

    python3 bench/train_throughput.py --out results/train_throughput_h200      # 20 runs on one H200
    python3 bench/train_throughput.py --dry-run                                  # the commands; no GPU
    python3 bench/train_throughput.py --budget-s 520 --out $OUT/train_throughput_h200   # in one 10-min window

(The 12 runs of the earlier arms took 5-6 min on the H200, ~25 s each; the 20 runs of these arms
should take about 10 min, so within ``--budget-s 520`` the last micro-batch-1 runs may be skipped,
reported as such. Needs the ``te`` and ``cute`` extras: ``pip install -e '.[te,cute]'``.)

Every (arm, micro-batch) is its own ``pretrain_llama.py`` process, one after the other: the 8B
recipe with ``model.num_layers=L`` (default 12: what fits one H200), sequence 4096, micro-batch 1, 2,
4 with no accumulation, no checkpoints, 3 warm-up + 6 timed steps. Arms (``plan.py``): ``bf16``
(the baseline: Transformer Engine BF16 projections, FA4 BF16 attention: the BF16 stack a user
runs), ``fp8-attn`` (TE BF16 projections, our fp8 attention on ``cute``), ``te-fp8`` (TE FP8
projections, FA4 BF16 attention), ``te-fp8+fp8-attn`` and ``te-fp8+nvfp4qk_fp8pv`` (TE FP8
projections, our attention on ``cute``); ``--backend-override RECIPE=BACKEND`` changes a recipe's
backend; opt-in ``local-bf16``, ``local-bf16+fp8-attn``, ``local-bf16+nvfp4qk_fp8pv`` use
megatron-core's local projections (no Transformer Engine). An arm whose Transformer Engine or
attention backend does not import here is refused before anything runs (exit 2: what to install,
what runs without it); ``--dry-run`` prints the plan and that sentence. Per run: median step time
of the timed steps, tokens/s/GPU, MFU, peak memory, the last loss, the ratio to the ``bf16`` arm;
per recipe, the attention alone at the training shape on its backend (its share of a step); per
arm, the step time extrapolated to 32 layers from a second run at ``--extrapolate-from-layers``
layers, and a 64-GPU estimate from it.

Order (what matters most first, for a benchmark cut short): the main runs at the largest
micro-batch, the extrapolation runs, then the other micro-batches. ``--budget-s`` skips runs that
would start too late; a SIGTERM to the benchmark (e.g. from ``timeout``) stops the running child and
writes what was measured.

Outputs (``--out PREFIX``): ``PREFIX.json`` (one record per run with every number, the exact command
and the tail of the log of a failed run; metadata: date UTC, GPU, torch / triton / megatron-core
versions, git commit (``$BENCH_COMMIT`` overrides), L) and ``PREFIX.md`` (tables, the throughput and
memory targets with PASS/MISS, the extrapolation), both rewritten after every run. A failed run (out
of memory, non-zero exit, timeout, missing steps, non-finite loss) is recorded and the others go on;
the exit code is 1 if a run or the attention timing of a recipe failed, 2 for an invalid run config
or a missing dependency. The markdown report is printed last, its runs table at the end.

The benchmark itself is the package ``bench/throughput/``; each module's docstring says how its part
is done: ``plan.py`` (the arms, the runs, their overrides, why 12 layers fit), ``deps.py`` (what
the arms need installed), ``process.py`` (the child processes), ``attention.py`` (the attention
share), ``analysis.py`` (the numbers per run, the ratios, the targets, the MFU formula, the
extrapolation and its assumptions), ``report.py`` (the outputs), ``runner.py`` (the order, the
budget, a stop).
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
from throughput.deps import missing_dependencies, refusal
from throughput.plan import (
    ALL_ARMS,
    ARMS,
    BASE_CONFIG,
    FASTEST_BACKEND,
    LOCAL_ARMS,
    backend_table,
    plan_runs,
    validate_runs,
    with_baseline,
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
        "--accumulation",
        type=int,
        default=1,
        help="micro-batches per step (global batch = accumulation x micro-batch; default 1). The 8B "
        "recipe accumulates 4 at 64 GPUs: what Transformer Engine's FP8 weight cache "
        "(projection.fp8_weight_cache) saves work across",
    )
    p.add_argument(
        "--arms",
        nargs="+",
        choices=list(ALL_ARMS),
        default=list(ARMS),
        help=f"default: {', '.join(ARMS)}; opt-in, megatron-core's local projections (no Transformer "
        f"Engine): {', '.join(LOCAL_ARMS)}. Run in this order; the baseline (bf16, or local-bf16 when "
        "only local arms are chosen) is always run",
    )
    p.add_argument(
        "--backend-override",
        nargs="+",
        default=[],
        metavar="RECIPE=BACKEND",
        help="attention backend of a recipe, for every arm of that recipe (default, the fastest on the "
        f"H200: {', '.join(f'{r}={b}' for r, b in FASTEST_BACKEND.items())}), e.g. fp8=triton",
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
    if min(args.warmup, args.timed, args.layers, args.accumulation, *args.micro_batches) < 1:
        p.error("--warmup, --timed, --layers, --accumulation and --micro-batches must be >= 1")
    if args.extrapolate_from_layers < 0 or not 0 < args.dp_efficiency <= 1:
        p.error("--extrapolate-from-layers must be >= 0 and --dp-efficiency in (0, 1]")
    args.micro_batches = sorted(set(args.micro_batches))
    try:
        args.backends = backend_table(args.backend_override)
    except ValueError as err:
        p.error(str(err))
    args.arms = with_baseline(args.arms)  # every ratio is against the baseline arm
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit code: 0 all ran, 1 something failed, 2 an invalid run config
    or a dependency of an arm that does not import (``--dry-run``: printed, exit 0)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.attention_timing_json:  # the child process of throughput.attention.run_attention_timing
        cases = dict(item.partition("=")[::2] for item in args.attention_recipes)
        recs = time_attention(list(cases), args.micro_batches, seq=args.seq, backend=cases)
        Path(args.attention_timing_json).write_text(json.dumps(recs, indent=1))
        return 0
    t_start = time.perf_counter()
    # megatron-core warns at import about optional packages (TE, Apex); each run's log says what it uses
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.core\..*")
    specs = plan_runs(args)
    try:
        validate_runs(specs, args.config)
    except ValueError as err:
        print(f"train_throughput: {err}", file=sys.stderr)
        return 2
    missing, notes = missing_dependencies(specs)
    for note in notes:
        print(note, flush=True)
    for i, s in enumerate(specs, 1):
        print(
            f"[{i}/{len(specs)}] {s.name} ({s.purpose}; plan estimate "
            f"{s.plan['memory_estimate_gib']:.1f} GiB, {s.plan['parameters'] / 1e9:.2f}B parameters): "
            f"{shlex.join(s.argv)}",
            flush=True,
        )
    if missing:
        sentence = f"train_throughput: {refusal(missing)}"
        if args.dry_run:  # the plan is printed; a real run here would stop now
            print(f"not runnable here: {sentence}", flush=True)
            return 0
        print(sentence, file=sys.stderr)
        return 2
    if args.dry_run:
        return 0
    meta = {**metadata(args, notes), **plan_metadata(next(s for s in specs if s.purpose == "main"))}
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    with sigterm_raises_terminated():
        return measure(args, specs, meta, t_start)


if __name__ == "__main__":
    raise SystemExit(main())
