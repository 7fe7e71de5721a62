"""Running the benchmark's measurements in order: the attention timing, then every planned run.

Each run is one child process (:mod:`throughput.process`); its record gets status ``ok`` with its
numbers, or ``failed`` with a reason (out of memory, non-zero exit, timeout, missing steps,
non-finite loss) and the tail of its log, and the others go on. ``--budget-s`` skips runs that would
start too late; a SIGTERM to the benchmark (e.g. from ``timeout``) stops the running child and
writes what was measured. The outputs are rewritten after every run.
"""

from __future__ import annotations

import math
import shlex
import shutil
import time
from pathlib import Path

from .analysis import summarize_metrics
from .attention import run_attention_timing
from .plan import RunSpec
from .process import Terminated, failure_reason, log_tail, run_process
from .report import build_report, cell, to_markdown, write_outputs


def base_record(spec: RunSpec, args) -> dict:
    """The part of a run's record known before it runs; its numbers (``tokens_per_s_per_gpu``, ``mfu``,
    ``peak_mem_gib``) None until it has run."""
    return {
        "name": spec.name,
        "arm": spec.arm,
        "projection": spec.plan["projection"],
        "transformer_impl": spec.plan["transformer_impl"],
        "attention": spec.plan["recipe"],
        "attention_recipe": spec.plan["recipe"],  # the field's name in the JSON of the earlier arms
        "backend": spec.plan["backend"],
        "micro_batch": spec.micro_batch,
        "accumulation": spec.accumulation,
        "layers": spec.layers,
        "purpose": spec.purpose,
        "seq_length": spec.plan["seq_length"],
        "tokens_per_step": spec.plan["tokens_per_step"],
        "train_iters": spec.plan["train_iters"],
        "warmup_steps": args.warmup,
        "timed_steps": args.timed,
        "parameters": spec.plan["parameters"],
        "flops_per_token": spec.plan["flops_per_token"],
        "peak_flops_per_gpu": spec.plan["peak_flops_per_gpu"],
        "memory_estimate_gib": spec.plan["memory_estimate_gib"],
        "command": shlex.join(spec.argv),
        "output_dir": str(spec.output_dir),
        "tokens_per_s_per_gpu": None,
        "mfu": None,
        "peak_mem_gib": None,
    }


def execute_run(spec: RunSpec, args, timeout_s: float) -> dict:
    """Run one spec and return its record (status ``ok`` or ``failed`` with ``failure`` and ``log_tail``)."""
    if spec.output_dir.exists():
        shutil.rmtree(spec.output_dir)  # a fresh run directory (metrics.jsonl is appended to)
    log_path = Path(args.run_dir) / f"{spec.name}.log"
    res = run_process(spec.argv, log_path=log_path, timeout_s=timeout_s)
    rec = base_record(spec, args)
    rec.update(res, log=str(log_path))
    tail = log_tail(log_path)
    if res["exit_code"] != 0 or res["timed_out"]:
        return {
            **rec,
            "status": "failed",
            "failure": failure_reason(res["exit_code"], res["timed_out"], tail, timeout_s),
            "log_tail": tail,
        }
    try:
        rec.update(
            summarize_metrics(
                spec.output_dir / "metrics.jsonl",
                warmup=args.warmup,
                timed=args.timed,
                tokens_per_step=spec.plan["tokens_per_step"],
                flops_per_token=spec.plan["flops_per_token"],
                peak_flops=spec.plan["peak_flops_per_gpu"],
            )
        )
    except (OSError, ValueError, KeyError) as err:
        return {**rec, "status": "failed", "failure": f"metrics: {err}", "log_tail": tail}
    if not math.isfinite(rec["last_loss"]):
        return {
            **rec,
            "status": "failed",
            "failure": f"last loss not finite ({rec['last_loss']})",
            "log_tail": tail,
        }
    return {**rec, "status": "ok", "failure": None}


def prepare_default_corpus(cache_dir: str | None) -> None:
    """Prepare the embedded corpus here, once, before any run (the runs then only read it); a failure is
    printed and left to the runs to report."""
    from data import ensure_default_corpus

    t0 = time.perf_counter()
    try:
        ensure_default_corpus(cache_dir, log=lambda m: print(f"data: {m}", flush=True))
    except Exception as err:  # noqa: BLE001 - every run will fail with the same message, recorded per run
        print(f"data: preparing the default corpus failed: {type(err).__name__}: {err}", flush=True)
        return
    print(f"data: default corpus ready in {time.perf_counter() - t0:.0f} s", flush=True)


def _print_result(i: int, n: int, spec: RunSpec, rec: dict) -> None:
    if rec["status"] == "ok":
        print(
            f"[{i}/{n}] {spec.name}: ok in {rec['wall_s']:.0f} s: median step "
            f"{1e3 * rec['median_step_s']:.1f} ms, {rec['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, MFU "
            f"{100 * rec['mfu']:.1f}%, peak {cell(rec['peak_mem_gib'], '.1f')} GiB, last loss "
            f"{rec['last_loss']:.3f}",
            flush=True,
        )
    else:
        print(
            f"[{i}/{n}] {spec.name}: FAILED ({rec['failure']}) after {rec.get('wall_s', 0):.0f} s"
            + (f"\n{rec['log_tail'][-3000:]}" if rec.get("log_tail") else ""),
            flush=True,
        )


def measure(args, specs: list[RunSpec], meta: dict, t_start: float) -> int:
    """The attention timing and the runs, in order; writes and prints the report; returns the exit code
    (1 if a run or the attention timing of a recipe failed, else 0).

    Expects SIGTERM to raise :class:`~throughput.process.Terminated` (see
    :func:`~throughput.process.sigterm_raises_terminated`): the runs not completed are then recorded
    as such and the report is still written.
    """
    attention = []
    attention_error = "skipped (--no-attention-timing)" if args.no_attention_timing else "not run"
    records = []
    try:
        if specs[0].plan["default_corpus"]:
            prepare_default_corpus(specs[0].plan["data_cache_dir"])
        if not args.no_attention_timing:
            recipes = {s.plan["recipe"]: s.plan["backend"] for s in specs}
            attention, attention_error = run_attention_timing(args, recipes)
        for i, spec in enumerate(specs, 1):
            left = args.budget_s - (time.perf_counter() - t_start) if args.budget_s else math.inf
            if left < 30:
                rec = {
                    **base_record(spec, args),
                    "status": "failed",
                    "failure": "not run: --budget-s reached",
                }
            else:
                print(f"[{i}/{len(specs)}] {spec.name}: running", flush=True)
                rec = execute_run(spec, args, timeout_s=min(args.timeout, left))
            records.append(rec)
            _print_result(i, len(specs), spec, rec)
            write_outputs(
                args.out, build_report(meta, records, attention, attention_error, args.dp_efficiency)
            )
    except (Terminated, KeyboardInterrupt) as err:
        meta["terminated"] = (
            f"the benchmark was stopped ({err or 'SIGINT'}) after {time.perf_counter() - t_start:.0f} s"
        )
        print(f"train_throughput: {meta['terminated']}; writing what was measured", flush=True)
        if attention_error == "not run":
            attention_error = f"failed ({meta['terminated']})"
        done = {r["name"] for r in records}
        records += [
            {**base_record(s, args), "status": "failed", "failure": f"not completed: {meta['terminated']}"}
            for s in specs
            if s.name not in done
        ]
    report = build_report(meta, records, attention, attention_error, args.dp_efficiency)
    meta["total_wall_s"] = time.perf_counter() - t_start
    write_outputs(args.out, report)
    print(
        f"total wall time {meta['total_wall_s']:.0f} s"
        + (f"; wrote {args.out}.json and .md" if args.out else "")
    )
    print(to_markdown(report, terminal=True))
    # a failed run, or a missing attention share (the cuDNN control's errors are only reported)
    failed = (
        any(r["status"] != "ok" for r in records)
        or (attention_error or "").startswith("failed")
        or any("error" in a for a in attention if a["impl"] != "cudnn_bf16_sdpa")
    )
    return 1 if failed else 0
