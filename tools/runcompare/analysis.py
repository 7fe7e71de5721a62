"""Compare precision arms of aligned runs: per-window loss gaps with bootstrap intervals, validation
gaps, non-finite counts and throughput. Produces one JSON-ready dict (see :func:`compare`).

Units: tokens (window edges, consumed tokens), nats (losses, gaps), tokens/s/GPU (throughput).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .runs import (
    Aligned,
    CompareError,
    RunData,
    align,
    check_fingerprints,
    group_arms,
    load_run,
    pick_baseline,
    unique_names,
)
from .stats import (
    GapEstimate,
    assign_windows,
    bootstrap_gap,
    choose_method,
    paired_points,
    point_gap,
    window_edges,
)

MIN_POINTS_STEP_RESAMPLING = 5  # fewer points in a window: no step (block) resampling there
FEW_SEEDS = 5


@dataclass
class Options:
    """Analysis options (the CLI flags). Exactly one of ``windows``/``window_tokens`` is used;
    ``window_tokens`` wins when given. ``block_len`` None = automatic (Politis-White)."""

    windows: int = 10
    window_tokens: int | None = None
    ci: float = 0.95
    n_boot: int = 2000
    bootstrap_seed: int = 0
    bootstrap: str = "auto"
    block_len: int | None = None
    baseline: str | None = None
    max_tokens: int | None = None
    force: bool = False
    skip_malformed: bool = False


def _f(x) -> float | None:
    """JSON-safe float: None for NaN/inf/None."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _rng(seed: int, *parts: str | int) -> np.random.Generator:
    """Generator for one estimate, independent of the order in which estimates are computed."""
    key = [seed & 0xFFFFFFFF] + [zlib.crc32(str(p).encode()) for p in parts]
    return np.random.default_rng(key)


def _matrix(names: list[str], series: dict[str, np.ndarray], sel: np.ndarray) -> np.ndarray:
    """(runs, points) float64 loss matrix with non-finite values as NaN."""
    m = np.stack([series[n][sel] for n in names]).astype(np.float64)
    m[~np.isfinite(m)] = np.nan
    return m


def _estimate(arm_m, base_m, method, opt: Options, rng) -> GapEstimate:
    n = paired_points(arm_m, base_m)[0].shape[1]  # points finite in every run
    multi = arm_m.shape[0] >= 2 and base_m.shape[0] >= 2
    used = method
    if method in ("blocks", "hier") and n < MIN_POINTS_STEP_RESAMPLING:
        used = "seeds" if multi else None
    if used is None:
        gap, why = point_gap(arm_m, base_m)
        return GapEstimate(gap, None, None, n, None, n_excluded=arm_m.shape[1] - n, note=why or (
            f"no interval: one seed in an arm and {n} point(s) "
            f"(resampling steps needs {MIN_POINTS_STEP_RESAMPLING})"
        ))
    est = bootstrap_gap(
        arm_m, base_m, method=used, n_boot=opt.n_boot, ci=opt.ci, rng=rng,
        block_len=opt.block_len, min_points=MIN_POINTS_STEP_RESAMPLING,
    )
    if used != method and est.gap is not None:
        extra = f"{n} point(s), fewer than {MIN_POINTS_STEP_RESAMPLING}: seeds resampled, steps not"
        est.note = extra if est.note is None else f"{est.note}; {extra}"
    return est


def _windowed(arm_names, base_names, series, tokens, widx, n_win, method, opt, label, kind):
    """Per-window estimates (list of dicts) for one arm vs the baseline."""
    out = []
    for w in range(n_win):
        sel = widx == w
        est = _estimate(
            _matrix(arm_names, series, sel), _matrix(base_names, series, sel), method, opt,
            _rng(opt.bootstrap_seed, label, kind, w),
        )
        d = est.to_dict()
        d["window"] = w
        out.append(d)
    return out


def _first_significant(rows: list[dict]) -> int | None:
    for r in rows:
        if r["significant"]:
            return r["window"]
    return None


def _run_summary(r: RunData, aligned: Aligned) -> dict:
    m = aligned.train_mask[r.name]
    loss = r.train["loss"][m]
    val = aligned.val_loss[r.name]
    tps = r.train["tokens_per_s_per_gpu"][m]
    tps = tps[np.isfinite(tps)]
    gn = r.train["grad_norm"][m]
    gn_null = np.isnan(gn)  # null grad norms (also NaN) are not counted as non-finite
    finite_loss = loss[np.isfinite(loss)]
    finite_val = val[np.isfinite(val)]
    return {
        "name": r.name,
        "path": str(r.path),
        "arm": r.arm,
        "seed": r.seed,
        "commit": r.commit,
        "attention_recipe": r.attention_recipe,
        "attention_backend": r.attention_backend,
        "projection": r.projection,
        "world_size": r.world_size,
        "train_records": int(m.sum()),
        "valid_records": int(val.size),
        "records_replaced_by_later": r.n_replaced,
        "malformed_lines_skipped": r.n_malformed,
        "record_counts": dict(r.record_counts),
        "events": dict(r.events),
        "nonfinite": {
            "train_loss": int((~np.isfinite(loss)).sum()),
            "val_loss": int((~np.isfinite(val)).sum()),
            "grad_norm": int((np.isinf(gn) & ~gn_null).sum()),
            "skipped_steps": int(r.train["skipped"][m].sum()),
            "nonfinite_count_last": int(r.train["nonfinite_count"][m][-1]),
        },
        "median_tokens_per_s_per_gpu": _f(np.median(tps)) if tps.size else None,
        "last_train_loss": _f(loss[-1]),
        "last_finite_train_loss": _f(finite_loss[-1]) if finite_loss.size else None,
        "last_val_loss": _f(val[-1]) if val.size else None,
        "last_finite_val_loss": _f(finite_val[-1]) if finite_val.size else None,
    }


def compare(run_dirs: list[str], opt: Options) -> dict:
    """Load, check, align and compare the runs in ``run_dirs``.

    Raises :class:`CompareError` (with every reason found) when runs are refused. Returns a dict:
    ``warnings``, ``baseline``, ``fingerprints``, ``grid``, ``windows`` (token edges),
    ``runs`` (per-run facts: seed, commit, precision, non-finite counts, throughput),
    ``arms`` (members, median tokens/s/GPU, ratio vs baseline), ``comparisons`` (per non-baseline
    arm: per-window train and validation gaps with intervals, first significant window, final
    and overall gaps), ``series`` (aligned per-run curves, for plots).
    """
    if len(run_dirs) < 2:
        raise CompareError("need at least two runs")
    resolved = [str(Path(d).resolve()) for d in run_dirs]
    dups = sorted({d for d in resolved if resolved.count(d) > 1})
    if dups:
        raise CompareError(f"run directory given more than once: {', '.join(dups)}")
    errors, runs = [], []
    for d in run_dirs:
        try:
            runs.append(load_run(d, skip_malformed=opt.skip_malformed))
        except CompareError as e:
            errors.extend(e.reasons)
    if errors:
        raise CompareError(errors)
    unique_names(runs)
    warnings = check_fingerprints(runs, force=opt.force)
    arms, w2 = group_arms(runs, force=opt.force)
    warnings += w2
    base = pick_baseline(arms, opt.baseline)
    aligned = align(runs, max_tokens=opt.max_tokens)
    for r in runs:
        if r.n_malformed:
            warnings.append(f"{r.name}: {r.n_malformed} malformed line(s) skipped (--skip-malformed)")
    world = {r.world_size for r in runs}
    if len(world) > 1:
        warnings.append(f"world sizes differ ({sorted(world)}); throughput is per GPU")

    tokens = aligned.tokens
    edges = window_edges(
        tokens,
        n_windows=None if opt.window_tokens else opt.windows,
        window_tokens=opt.window_tokens,
    )
    n_win = len(edges) - 1
    widx = assign_windows(tokens, edges)
    vidx = assign_windows(aligned.val_tokens, edges) if aligned.val_tokens.size else np.zeros(0, int)
    steps_per = np.diff(tokens)
    grid = {
        "n_train_points": int(tokens.size),
        "first_tokens": int(tokens[0]),
        "last_tokens": int(tokens[-1]),
        "tokens_per_step": int(steps_per[0]) if steps_per.size and np.all(steps_per == steps_per[0]) else None,
        "n_val_points": int(aligned.val_tokens.size),
        "max_tokens": opt.max_tokens,
    }
    windows = [
        {
            "window": w,
            "lo_tokens": float(edges[w]),
            "hi_tokens": float(edges[w + 1]),
            "n_train_points": int((widx == w).sum()),
            "n_val_points": int((vidx == w).sum()),
        }
        for w in range(n_win)
    ]

    run_rows = [_run_summary(r, aligned) for r in runs]
    by_name = {row["name"]: row for row in run_rows}
    arm_rows = {}
    for label, members in arms.items():
        tps = np.concatenate([
            r.train["tokens_per_s_per_gpu"][aligned.train_mask[r.name]] for r in members
        ])
        tps = tps[np.isfinite(tps)]
        arm_rows[label] = {
            "runs": [r.name for r in members],
            "seeds": [r.seed for r in members],
            "is_baseline": label == base,
            "median_tokens_per_s_per_gpu": _f(np.median(tps)) if tps.size else None,
            "nonfinite_train_loss": sum(by_name[r.name]["nonfinite"]["train_loss"] for r in members),
            "nonfinite_val_loss": sum(by_name[r.name]["nonfinite"]["val_loss"] for r in members),
            "skipped_steps": sum(by_name[r.name]["nonfinite"]["skipped_steps"] for r in members),
        }
    b_tps = arm_rows[base]["median_tokens_per_s_per_gpu"]
    for row in arm_rows.values():
        a = row["median_tokens_per_s_per_gpu"]
        row["throughput_ratio_vs_baseline"] = _f(a / b_tps) if (a is not None and b_tps) else None

    base_names = [r.name for r in arms[base]]
    comparisons = []
    for label, members in arms.items():
        if label == base:
            continue
        names = [r.name for r in members]
        method = choose_method(len(names), len(base_names), opt.bootstrap)
        cmp_warn = []
        if method in ("seeds", "hier") and min(len(names), len(base_names)) < FEW_SEEDS:
            cmp_warn.append(
                f"only {len(names)} and {len(base_names)} seeds: seed-resampled intervals are coarse "
                f"and may undercover"
            )
        if method == "blocks" and (len(names) == 1 or len(base_names) == 1):
            cmp_warn.append(
                "one seed in an arm: intervals reflect step-to-step noise within the runs only, "
                "not seed-to-seed variation"
            )
        tw = _windowed(names, base_names, aligned.loss, tokens, widx, n_win, method, opt, label, "train")
        all_t = np.ones(tokens.shape, bool)
        overall = _estimate(
            _matrix(names, aligned.loss, all_t), _matrix(base_names, aligned.loss, all_t), method, opt,
            _rng(opt.bootstrap_seed, label, "train-overall"),
        ).to_dict()
        cmp = {
            "arm": label,
            "baseline": base,
            "method": method,
            "n_seeds": [len(names), len(base_names)],
            "warnings": cmp_warn,
            "train_windows": tw,
            "train_first_significant_window": _first_significant(tw),
            "train_significant_windows": [r["window"] for r in tw if r["significant"]],
            "train_final": tw[-1],
            "train_overall": overall,
            "valid_windows": [],
            "valid_first_significant_window": None,
            "valid_significant_windows": [],
            "valid_final": None,
            "valid_overall": None,
        }
        if aligned.val_tokens.size:
            vw = _windowed(
                names, base_names, aligned.val_loss, aligned.val_tokens, vidx, n_win, method, opt, label, "valid"
            )
            last = np.zeros(aligned.val_tokens.shape, bool)
            last[-1] = True
            allv = np.ones(aligned.val_tokens.shape, bool)
            final = _estimate(
                _matrix(names, aligned.val_loss, last), _matrix(base_names, aligned.val_loss, last),
                method, opt, _rng(opt.bootstrap_seed, label, "valid-final"),
            ).to_dict()
            final["tokens"] = int(aligned.val_tokens[-1])
            cmp.update(
                valid_windows=vw,
                valid_first_significant_window=_first_significant(vw),
                valid_significant_windows=[r["window"] for r in vw if r["significant"]],
                valid_final=final,
                valid_overall=_estimate(
                    _matrix(names, aligned.val_loss, allv), _matrix(base_names, aligned.val_loss, allv),
                    method, opt, _rng(opt.bootstrap_seed, label, "valid-overall"),
                ).to_dict(),
            )
        comparisons.append(cmp)

    return {
        "warnings": warnings,
        "baseline": base,
        "fingerprints": {
            "config": sorted({r.config_fingerprint for r in runs}),
            "data_order": sorted({r.data_order_fingerprint for r in runs}),
        },
        "grid": grid,
        "windows": windows,
        "runs": run_rows,
        "arms": arm_rows,
        "comparisons": comparisons,
        "series": {
            "tokens": tokens,
            "loss": aligned.loss,
            "val_tokens": aligned.val_tokens,
            "val_loss": aligned.val_loss,
        },
    }
