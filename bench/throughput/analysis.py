"""The numbers of the throughput benchmark: per run, derived across runs, the targets, the extrapolation.

Ratios: ``vs_bf16`` = a run's tokens/s/GPU / that of the baseline arm (``bf16``; ``local-bf16`` when
only local arms ran) at the same micro-batch and layer count in the same benchmark (None when that
run failed or is absent), ``peak_mem_vs_bf16`` the same for peak memory. The targets, at
micro-batch 4: ``te-fp8+fp8-attn`` >= 1.3x ``bf16`` and not slower than ``te-fp8``; at every
micro-batch, the peak memory of every low-precision arm <= ``bf16``'s; each PASS or MISS (a
target whose runs failed is a MISS).

Numbers per run, from its ``metrics.jsonl`` (``training/metrics.py``): the median ``step_time_s``
over the timed steps (warm-up steps excluded: Triton compilation, allocator growth), tokens/s/GPU =
micro-batch x 4096 / median step, MFU with the trainer's formula (``training/plan.py``)::

    MFU = tokens/s/GPU x flops_per_token / logging.peak_flops_per_gpu
    flops_per_token = 6 * N_matmul + 6 * L * s * Hq * d

(N_matmul: every parameter but the input embedding, the output layer included; the second term is
QK^T and PV, 2 * 2 * s * Hq * d per token and layer forward, x3 for forward + backward, halved for
the causal mask; peak 989.4 TFLOP/s = H100/H200 SXM dense BF16, for every arm), peak memory (max of
``peak_mem_gib`` = ``torch.cuda.max_memory_allocated``; and the device's peak ``memory.used`` polled
with ``nvidia-smi``, which includes the allocator's reserve and the CUDA context), the last loss
(sanity: finite).

Extrapolation to the 32-layer model (which does not fit on one GPU): each arm runs again at the
largest micro-batch with ``--extrapolate-from-layers`` L2 layers (default 4); the line
step_time = a + b * layers through (L2, t2) and (L, t) gives the 32-layer step time, tokens/s/GPU
on one GPU, and, times an ASSUMED data-parallel efficiency (``--dp-efficiency``, default 0.95), an
estimate for the 64-GPU recipe (``configs/llama3_1_8b_100b_*.yaml``: DP 64, micro-batch 4,
accumulation 4, distributed optimizer), printed next to the paper's GB200 numbers. The single-GPU
step includes a full (unsharded) optimizer step per micro-batch, which DP 64 shards and
accumulation 4 amortizes: the estimate is on the low side.
"""

from __future__ import annotations

import os
import statistics

from .plan import ALL_ARMS, baseline_arm

TARGET_LAYERS = 32
TARGET_MICRO_BATCH = 4
TARGET_ARM = "te-fp8+fp8-attn"  # at micro-batch 4: >= SPEEDUP_TARGET x bf16, and >= 1x SAME_PROJECTION_ARM
SPEEDUP_TARGET = 1.3
SAME_PROJECTION_ARM = "te-fp8"


def summarize_metrics(
    path: str | os.PathLike,
    *,
    warmup: int,
    timed: int,
    tokens_per_step: int,
    flops_per_token: float,
    peak_flops: float,
) -> dict:
    """Throughput numbers of one run from its ``metrics.jsonl``.

    Args:
        warmup, timed: steps 1..warmup are excluded; steps warmup+1..warmup+timed are timed.
        tokens_per_step: global batch x sequence (one GPU).
        flops_per_token: training FLOPs per token (``training.plan.flops_per_token``).
        peak_flops: FLOP/s per GPU for MFU.
    Returns:
        ``median_step_s`` (s), ``step_times_s``, ``tokens_per_s_per_gpu``, ``mfu`` (fraction),
        ``mfu_trainer_median`` (the trainer's per-step MFU, median; None on CPU), ``peak_mem_gib``
        (max over all steps; None if never reported), ``last_step``, ``last_loss``, ``skipped_steps``.
    Raises:
        ValueError: fewer than ``timed`` timed steps in the file, or no train record at all.
    """
    from training.metrics import read_metrics

    trains = [r for r in read_metrics(path) if r["kind"] == "train"]
    window = [r for r in trains if warmup < r["step"] <= warmup + timed]
    if len(window) < timed:
        raise ValueError(
            f"{path}: {len(window)} of the {timed} timed steps (steps {warmup + 1}.."
            f"{warmup + timed}) are in the file ({len(trains)} train records)"
        )
    median_step = statistics.median(r["step_time_s"] for r in window)
    tps = tokens_per_step / median_step
    trainer_mfu = [r["mfu"] for r in window if r.get("mfu") is not None]
    mems = [r["peak_mem_gib"] for r in trains if r.get("peak_mem_gib") is not None]
    last = max(trains, key=lambda r: r["step"])
    return {
        "median_step_s": median_step,
        "step_times_s": [r["step_time_s"] for r in window],
        "tokens_per_s_per_gpu": tps,
        "mfu": tps * flops_per_token / peak_flops,
        "mfu_trainer_median": statistics.median(trainer_mfu) if len(trainer_mfu) == len(window) else None,
        "peak_mem_gib": max(mems) if mems else None,
        "last_step": last["step"],
        "last_loss": last["loss"],
        "skipped_steps": sum(bool(r["skipped"]) for r in trains),
    }


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``y = a + b * x`` (exact through two points); returns (a, b).

    Raises:
        ValueError: fewer than two distinct x.
    """
    xs = {x for x, _ in points}
    if len(xs) < 2:
        raise ValueError(f"need two distinct layer counts to fit a line, got {sorted(xs)}")
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, b


def derive(records: list[dict], attention: list[dict]) -> None:
    """Add ``attention_*`` (per layer, x layers, share of the step) and the ratios to the baseline arm
    (``vs_bf16``, ``peak_mem_vs_bf16``: None without an ``ok`` baseline run of the same micro-batch
    and layer count), in place."""
    timing = {(a["impl"], a["micro_batch"]): a for a in attention if "error" not in a}
    baseline = baseline_arm([r["arm"] for r in records])
    base = {
        (r["micro_batch"], r["layers"]): r for r in records if r["arm"] == baseline and r["status"] == "ok"
    }
    for r in records:
        t = timing.get((r["attention"], r["micro_batch"]))
        r["attention_fwd_ms"] = t["fwd_ms"] if t else None
        r["attention_fwd_bwd_ms"] = t["fwd_bwd_ms"] if t else None
        ok = r["status"] == "ok"
        k = r.get("accumulation", 1)  # micro-batches per step, each with its attention
        r["attention_share"] = (
            k * r["layers"] * t["fwd_bwd_ms"] / (1e3 * r["median_step_s"]) if t and ok else None
        )
        b = base.get((r["micro_batch"], r["layers"]))
        r["vs_bf16"] = r["tokens_per_s_per_gpu"] / b["tokens_per_s_per_gpu"] if ok and b else None
        both = ok and b and r.get("peak_mem_gib") is not None and b.get("peak_mem_gib") is not None
        r["peak_mem_vs_bf16"] = r["peak_mem_gib"] / b["peak_mem_gib"] if both else None


def extrapolate(
    records: list[dict], *, dp_efficiency: float, target_layers: int = TARGET_LAYERS
) -> list[dict]:
    """Per arm: the 32-layer step time from the line through its runs at the extrapolation micro-batch.

    Uses every ``ok`` record of the arm at the micro-batch of its ``extrapolation`` runs (two layer
    counts: exact line). Returns dicts with ``a_s``, ``b_s_per_layer``, ``step_s``, ``tokens_per_s_1gpu``,
    ``tokens_per_s_per_gpu_64_est`` (x ``dp_efficiency``), ``mfu`` (FLOPs per token at 32 layers, on
    the line through the runs' own values, which are linear in the layer count; the runs' peak),
    ``vs_bf16``; or ``error``.
    """
    out = []
    for arm in dict.fromkeys(r["arm"] for r in records if r["purpose"] == "extrapolation"):
        mb = max(r["micro_batch"] for r in records if r["arm"] == arm and r["purpose"] == "extrapolation")
        pts = [r for r in records if r["arm"] == arm and r["micro_batch"] == mb and r["status"] == "ok"]
        rec = {"arm": arm, "micro_batch": mb, "points": [(r["layers"], r["median_step_s"]) for r in pts]}
        try:
            a, b = fit_line(rec["points"])
        except ValueError as err:
            out.append({**rec, "error": str(err)})
            continue
        step = a + b * target_layers
        if not (b > 0 and step > 0):
            out.append(
                {**rec, "error": f"the step time does not grow with the layer count (b = {b:.4g} s/layer)"}
            )
            continue
        tps = pts[0]["tokens_per_step"] / step
        f0, f1 = fit_line([(r["layers"], r["flops_per_token"]) for r in pts])
        fpt = f0 + f1 * target_layers
        out.append(
            {
                **rec,
                "a_s": a,
                "b_s_per_layer": b,
                "layers": target_layers,
                "step_s": step,
                "tokens_per_s_1gpu": tps,
                "tokens_per_s_per_gpu_64_est": tps * dp_efficiency,
                "dp_efficiency": dp_efficiency,
                "flops_per_token": fpt,
                "mfu": tps * fpt / pts[0]["peak_flops_per_gpu"],
            }
        )
    baseline = baseline_arm([r["arm"] for r in records])
    base = next((e for e in out if e["arm"] == baseline and "error" not in e), None)
    for e in out:
        ok = base and "error" not in e
        e["vs_bf16"] = e["tokens_per_s_1gpu"] / base["tokens_per_s_1gpu"] if ok else None
    return out


def _ratio_target(label: str, num: dict | None, den: dict | None, bar: float, why_missing: str) -> dict:
    """A tokens/s/GPU ratio target: PASS when ``num`` / ``den`` >= ``bar``; MISS, "not measured", when
    one of the two runs is None."""
    if num is None or den is None:
        return {"target": label, "measured": f"not measured ({why_missing})", "result": "MISS"}
    ratio = num["tokens_per_s_per_gpu"] / den["tokens_per_s_per_gpu"]
    return {
        "target": label,
        "measured": (
            f"{num['tokens_per_s_per_gpu']:,.0f} vs {den['tokens_per_s_per_gpu']:,.0f} = {ratio:.3f}x"
        ),
        "result": "PASS" if ratio >= bar else "MISS",
    }


def targets(records: list[dict]) -> list[dict]:
    """The targets (module docstring) of the arms that were planned: ``target``, ``measured``,
    ``result`` (``PASS`` or ``MISS``; a target whose run failed, or was not planned at micro-batch 4,
    is a MISS, "not measured")."""
    main = [r for r in records if r["purpose"] == "main"]
    if not main:
        return []
    baseline = baseline_arm([r["arm"] for r in main])
    arms = list(dict.fromkeys(r["arm"] for r in main))
    planned = {(r["arm"], r["micro_batch"]) for r in main}
    ok = {(r["arm"], r["micro_batch"]): r for r in main if r["status"] == "ok"}
    mb = TARGET_MICRO_BATCH

    def why(*names: str) -> str:
        gone = [n for n in names if (n, mb) not in ok]
        unplanned = [n for n in gone if (n, mb) not in planned]
        return "; ".join(
            [f"{n} failed at micro-batch {mb}" for n in gone if n not in unplanned]
            + [f"{n} not run at micro-batch {mb}" for n in unplanned]
        )

    out = []
    if TARGET_ARM in arms:
        r = ok.get((TARGET_ARM, mb))
        out.append(
            _ratio_target(
                f"micro-batch {mb}: {TARGET_ARM} tokens/s/GPU >= {SPEEDUP_TARGET:.1f}x {baseline}",
                r,
                ok.get((baseline, mb)),
                SPEEDUP_TARGET,
                why(TARGET_ARM, baseline),
            )
        )
        if SAME_PROJECTION_ARM in arms:
            out.append(
                _ratio_target(
                    f"micro-batch {mb}: {TARGET_ARM} tokens/s/GPU >= {SAME_PROJECTION_ARM}'s (1.0x)",
                    r,
                    ok.get((SAME_PROJECTION_ARM, mb)),
                    1.0,
                    why(TARGET_ARM, SAME_PROJECTION_ARM),
                )
            )
    micro_batches = sorted({r["micro_batch"] for r in main})
    for arm in (a for a in arms if a in ALL_ARMS and ALL_ARMS[a].low_precision):
        parts, passed = [], True
        for m in (m for m in micro_batches if (arm, m) in planned):
            r, b = ok.get((arm, m)), ok.get((baseline, m))
            if r is None or b is None or r.get("peak_mem_vs_bf16") is None:
                parts.append(f"mb{m} not measured")
                passed = False
            else:
                parts.append(f"mb{m} {r['peak_mem_gib']:.1f} vs {b['peak_mem_gib']:.1f} GiB")
                passed &= r["peak_mem_gib"] <= b["peak_mem_gib"]
        out.append(
            {
                "target": f"peak memory (max allocated) of {arm} <= {baseline} at every micro-batch",
                "measured": "; ".join(parts),
                "result": "PASS" if passed else "MISS",
            }
        )
    return out
