"""The outputs of the throughput benchmark: the metadata, the JSON document (``PREFIX.json``: the
records of the runs and of the attention timing, the targets, the extrapolation) and the markdown
report (``PREFIX.md``; a shorter version, its runs table last, for the terminal)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import REPO
from .analysis import TARGET_LAYERS, derive, extrapolate, targets
from .plan import baseline_arm

# The paper (shared/seed, §7.5 and §7.7), GB200: tokens/s/GPU, BF16 -> low precision
PAPER_64GPU = (21_853, 24_303)  # 64 GPUs, global batch 1024, NVFP4-QK/FP8-PV attention + FP8 GEMMs: 1.112x
PAPER_1GPU_B4 = (19_173, 21_795)  # 8B full update on one GPU, B4, FP8 P/V: 1.137x (MFU 41.12% -> 46.74%)


def build_report(meta, records, attention, attention_error, dp_efficiency) -> dict:
    """The JSON document (derived columns, targets and extrapolation recomputed from the records)."""
    derive(records, attention)
    return {
        "meta": meta,
        "records": records,
        "attention": attention,
        "attention_error": attention_error,
        "targets": targets(records),
        "extrapolation": extrapolate(records, dp_efficiency=dp_efficiency),
    }


def write_outputs(prefix: str | None, report: dict) -> None:
    """Write ``PREFIX.json`` and ``PREFIX.md`` (nothing when ``prefix`` is None)."""
    if not prefix:
        return
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    Path(prefix + ".json").write_text(json.dumps(report, indent=1, allow_nan=True))
    Path(prefix + ".md").write_text(to_markdown(report))


def cell(x, fmt: str, none: str = "-") -> str:
    """``x`` formatted (a trailing ``%`` or ``x`` in ``fmt`` is a literal suffix), or ``none``."""
    if x is None:
        return none
    suffix = fmt[-1] if fmt[-1] in "%x" else ""
    return format(x, fmt[:-1] if suffix else fmt) + suffix


def _accumulation_text(meta: dict) -> str:
    k = meta.get("accumulation", 1)
    return "micro-batch" if k == 1 else f"{k} x micro-batch ({k} micro-batches per step)"


def _md_header(meta: dict) -> list[str]:
    L, m = meta["layers"], meta["model"]
    fpt = meta.get("flops_per_token_main")
    flops = f" = {fpt:.4e} at {L} layers" if fpt else ""
    return [
        f"# Training throughput, {m['preset']} layer shape x {L} layers, {meta['gpu']}",
        "",
        (
            f"- date {meta['date']}, commit {meta['commit']}, torch {meta['torch']}, triton "
            f"{meta['triton']}, "
            f"megatron-core {meta['megatron_core']}, python {meta['python']}"
        ),
        (
            f"- {L} layers of hidden {m['hidden_size']}, {m['num_attention_heads']}/{m['num_kv_heads']} "
            "heads, "
            f"head dim {m['head_dim']}, FFN {m['ffn_hidden_size']}, vocab {m['vocab_size']}; sequence "
            f"{meta['seq_length']}, global batch = {_accumulation_text(meta)} on one GPU, "
            f"{meta['warmup_steps']} warm-up + "
            f"{meta['timed_steps']} timed steps per run (median step time of the timed steps); no "
            "checkpoints "
            "written"
        ),
        *([f"- {'; '.join(meta['dependencies'])}"] if meta.get("dependencies") else []),
        *(
            [f"- STOPPED: {meta['terminated']}; the runs not completed are marked as such"]
            if meta.get("terminated")
            else []
        ),
        (
            f"- MFU = tokens/s/GPU x flops_per_token / {meta['peak_flops_per_gpu'] / 1e12:.1f} TFLOP/s "
            f"({meta['peak_note']}); flops_per_token = 6*N_matmul + 6*L*s*Hq*d{flops} (training/plan.py: "
            "N_matmul = all parameters but the input embedding; attention QK^T + PV, x3 forward+backward, "
            "/2 causal)"
        ),
        (
            "- peak GiB: max of torch.cuda.max_memory_allocated (metrics.jsonl); device GiB: peak nvidia-smi "
            "memory.used while the run ran (allocator reserve + CUDA context)"
        ),
        (
            "- attention share = layers x micro-batches per step x attention forward+backward time (alone, "
            "same shape, backend and "
            "recipe, quantization included) / median step time"
        ),
    ]


def projection_label(r: dict) -> str:
    """``bf16 (TE)``, ``te_fp8 (TE)``, ``bf16 (local)``: the precision and the layer spec of a run."""
    impl = r.get("transformer_impl")
    spec = {"transformer_engine": "TE", "local": "local"}.get(impl, impl)
    return f"{r['projection']} ({spec})" if spec else r["projection"]


def _md_runs(records: list[dict]) -> list[str]:
    baseline = baseline_arm([r["arm"] for r in records])
    lines = [
        "## Runs",
        "",
        f"- vs bf16: tokens/s/GPU / the {baseline} arm's at the same micro-batch (- when that run failed)",
        "",
        (
            "| arm | projections | attention | backend | micro-batch | median step ms | tokens/s/GPU | MFU | "
            "peak GiB | device GiB | attention share | vs bf16 | last loss | wall s | status |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    arms = list(dict.fromkeys(r["arm"] for r in records))
    main = (r for r in records if r["purpose"] == "main")
    for r in sorted(main, key=lambda r: (r["micro_batch"], arms.index(r["arm"]))):
        ok = r["status"] == "ok"
        status = "ok" if ok else f"FAILED: {r['failure']}"
        share = r.get("attention_share")
        lines.append(
            f"| {r['arm']} | {projection_label(r)} | {r['attention']} | {r.get('backend', '-')} | "
            f"{r['micro_batch']} | "
            f"{cell(1e3 * r['median_step_s'] if ok else None, '.1f')} | "
            f"{cell(r['tokens_per_s_per_gpu'] if ok else None, ',.0f')} | "
            f"{cell(100 * r['mfu'] if ok else None, '.1f%')} | "
            f"{cell(r.get('peak_mem_gib'), '.1f')} | {cell(r.get('peak_device_mem_gib'), '.1f')} | "
            f"{cell(100 * share if share is not None else None, '.1f%')} | "
            f"{cell(r.get('vs_bf16'), '.3fx')} | "
            f"{cell(r['last_loss'] if ok else None, '.3f')} | {cell(r.get('wall_s'), '.0f')} | {status} |"
        )
    return lines


def _md_attention(report: dict) -> list[str]:
    L = report["meta"]["layers"]
    lines = ["## Attention alone (per layer)", ""]
    if report.get("attention_error"):
        lines.append(f"- attention timing {report['attention_error'][:400]}")
    if not report["attention"]:
        return lines
    lines += [
        "| impl | backend | micro-batch | layout | fwd ms | fwd+bwd ms | fwd+bwd x layers ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in report["attention"]:
        head = f"| {a['impl']} | {a.get('backend', '-')} | {a['micro_batch']} | {a['layout']} |"
        if "error" in a:
            lines.append(f"{head} error: {a['error'][:80]} | - | - |")
        else:
            lines.append(f"{head} {a['fwd_ms']:.3f} | {a['fwd_bwd_ms']:.3f} | {L * a['fwd_bwd_ms']:.1f} |")
    cudnn = {
        a["micro_batch"]: a
        for a in report["attention"]
        if a["impl"] == "cudnn_bf16_sdpa" and "error" not in a
    }
    baseline = baseline_arm([r["arm"] for r in report["records"]])
    for r in report["records"]:
        c = cudnn.get(r["micro_batch"])
        if (
            r["purpose"] == "main"
            and r["arm"] == baseline
            and r["status"] == "ok"
            and c
            and r["attention_fwd_bwd_ms"]
        ):
            gain = r.get("accumulation", 1) * r["layers"] * (r["attention_fwd_bwd_ms"] - c["fwd_bwd_ms"])
            step_ms = 1e3 * r["median_step_s"]
            where = (
                f"- {baseline} arm, micro-batch {r['micro_batch']}: cuDNN BF16 attention instead of "
                f"{r.get('backend', 'its backend')}'s"
            )
            if gain > 0:
                tps = r["tokens_per_step"] / (r["median_step_s"] - gain / 1e3)
                lines.append(
                    f"{where} would save ~{gain:.1f} ms of the {step_ms:.1f} ms step (estimate: "
                    f"{tps:,.0f} tokens/s/GPU)"
                )
            else:
                lines.append(f"{where} would cost ~{-gain:.1f} ms more of the {step_ms:.1f} ms step")
    return lines


def _md_extrapolation(report: dict) -> list[str]:
    ex, meta = report["extrapolation"], report["meta"]
    lines = [f"## Extrapolation to {TARGET_LAYERS} layers (estimate)", ""]
    if not ex:
        return [*lines, "- not run (--extrapolate-from-layers 0)"]
    lines += [
        (
            f"- per arm, step_time = a + b x layers through its runs at micro-batch "
            f"{ex[0]['micro_batch']}; 64-GPU tokens/s/GPU = the {TARGET_LAYERS}-layer single-GPU value x "
            f"an ASSUMED data-parallel efficiency of {meta['dp_efficiency']:.2f} (the recipe "
            "configs/llama3_1_8b_100b_*.yaml: DP 64, micro-batch 4, accumulation 4, distributed "
            "optimizer); the single-GPU step includes a full unsharded optimizer step per micro-batch, so "
            "this is on the low side"
        ),
        "",
        (
            "| arm | points (layers, step s) | a s | b s/layer | 32-layer step s | tokens/s/GPU 1 GPU | "
            "MFU | tokens/s/GPU 64 GPUs (est.) | vs bf16 |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in ex:
        pts = ", ".join(f"({n}, {t:.3f})" for n, t in e["points"])
        if "error" in e:
            lines.append(f"| {e['arm']} | {pts} | error: {e['error']} | | | | | | |")
        else:
            lines.append(
                f"| {e['arm']} | {pts} | {e['a_s']:.3f} | {e['b_s_per_layer']:.4f} | "
                f"{e['step_s']:.3f} | {e['tokens_per_s_1gpu']:,.0f} | {100 * e['mfu']:.1f}% | "
                f"{e['tokens_per_s_per_gpu_64_est']:,.0f} | {cell(e['vs_bf16'], '.3fx')} |"
            )
    (b64, l64), (b1, l1) = PAPER_64GPU, PAPER_1GPU_B4
    lines.append(
        f"- the paper (GB200, another GPU: compare ratios, not absolute numbers): 64 GPUs {b64:,} "
        f"-> {l64:,} tokens/s/GPU (BF16 -> NVFP4-QK/FP8-PV attention + FP8 GEMMs, "
        f"{l64 / b64:.3f}x); one GPU, 8B full update at B4 (FP8 P/V): {b1:,} -> {l1:,} tokens/s "
        f"({l1 / b1:.3f}x)"
    )
    return lines


def to_markdown(report: dict, *, terminal: bool = False) -> str:
    """The markdown report of ``report`` (the JSON document of :func:`build_report`).

    The file (``terminal=False``): header, runs table, targets, attention, extrapolation, failed runs
    with their log tails, commands. ``terminal=True``: no log tails and no commands, the runs table last.
    """
    records = report["records"]
    targets_ = ["## Targets", ""] + (
        [f"- {t['result']}: {t['target']}: {t['measured']}" for t in report["targets"]] or ["- no main runs"]
    )
    failed = []
    for r in (r for r in records if r["status"] != "ok"):
        failed.append(f"- {r['name']}: {r['failure']} (log {r.get('log', '-')})")
        if not terminal and r.get("log_tail"):
            failed += ["", "```", r["log_tail"], "```", ""]
    failed = ["## Failed runs", "", *failed] if failed else []
    sections = [
        _md_header(report["meta"]),
        targets_,
        _md_attention(report),
        _md_extrapolation(report),
        failed,
    ]
    if terminal:
        sections.append(_md_runs(records))
    else:
        sections.insert(1, _md_runs(records))
        sections.append(["## Commands", "", *(f"- `{r['command']}`" for r in records)])
    return "\n\n".join("\n".join(sec) for sec in sections if sec) + "\n"


def _git_commit() -> str:
    """``$BENCH_COMMIT``, else the short HEAD, with ``+uncommitted changes`` when tracked files differ."""
    commit = os.environ.get("BENCH_COMMIT")
    if commit:
        return commit
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    commit = git.stdout.strip() or "unknown"
    status = (
        subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        if git.returncode == 0
        else None
    )
    if status is not None and status.stdout.strip():
        commit += "+uncommitted changes"
    return commit


def _gpu_name() -> str:
    """The first GPU's name from nvidia-smi (no CUDA context here)."""
    if not shutil.which("nvidia-smi"):
        return "no GPU"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown GPU (nvidia-smi failed)"


def metadata(args, dependencies: list[str]) -> dict:
    """Date UTC, GPU, versions, commit, the benchmark's settings, and ``dependencies`` (a sentence per
    package the arms need: :func:`throughput.deps.missing_dependencies`)."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    try:
        from importlib.metadata import version

        mcore = version("megatron-core")
    except Exception:  # noqa: BLE001
        mcore = "unknown"
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": _gpu_name(),
        "torch": torch.__version__,
        "triton": triton_version,
        "megatron_core": mcore,
        "python": sys.version.split()[0],
        "commit": _git_commit(),
        "layers": args.layers,
        "seq_length": args.seq,
        "micro_batches": args.micro_batches,
        "accumulation": getattr(args, "accumulation", 1),
        "arms": args.arms,
        "baseline": baseline_arm(args.arms),
        "backends": getattr(args, "backends", None),
        "warmup_steps": args.warmup,
        "timed_steps": args.timed,
        "extrapolate_from_layers": args.extrapolate_from_layers,
        "dp_efficiency": args.dp_efficiency,
        "dependencies": dependencies,
        "base_config": args.config,
        "extra_overrides": args.override,
    }


def plan_metadata(main_spec) -> dict:
    """The metadata taken from a main run's plan: peak FLOP/s (and whether it is the H200's), FLOPs per
    token, the model's shape."""
    peak = main_spec.plan["peak_flops_per_gpu"]
    note = (
        "logging.peak_flops_per_gpu; 989.4e12 = H100/H200 SXM dense BF16"
        if peak == 989.4e12
        else "logging.peak_flops_per_gpu, NOT the H200's 989.4e12 dense BF16"
    )
    return {
        "peak_flops_per_gpu": peak,
        "flops_per_token_main": main_spec.plan["flops_per_token"],
        "model": main_spec.plan["model"],
        "peak_note": note,
    }
