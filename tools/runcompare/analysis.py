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
    check_config_changes,
    check_fingerprints,
    check_learning_rates,
    group_arms,
    load_run,
    pick_baseline,
    unique_names,
)
from .spread import seed_spread, spread_row
from .stats import (
    PAIRED,
    SEED_METHODS,
    STEP_METHODS,
    GapEstimate,
    StatsError,
    assign_windows,
    bootstrap_gap,
    choose_method,
    paired_points,
    point_gap,
    window_edges,
)
from .welch import paired_interval, welch_interval

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
    if method in STEP_METHODS and n < MIN_POINTS_STEP_RESAMPLING:
        if arm_m.shape[0] >= 2 and base_m.shape[0] >= 2:
            return _seed_t_estimate(arm_m, base_m, paired=method in PAIRED.values(), ci=opt.ci)
        gap, why = point_gap(arm_m, base_m)
        return GapEstimate(
            gap,
            None,
            None,
            n,
            None,
            n_excluded=arm_m.shape[1] - n,
            note=why
            or (
                f"no interval: one seed in an arm and {n} point(s) "
                f"(resampling steps needs {MIN_POINTS_STEP_RESAMPLING})"
            ),
        )
    return bootstrap_gap(
        arm_m,
        base_m,
        method=method,
        n_boot=opt.n_boot,
        ci=opt.ci,
        rng=rng,
        block_len=opt.block_len,
        min_points=MIN_POINTS_STEP_RESAMPLING,
    )


def _seed_t_estimate(arm_m, base_m, *, paired: bool, ci: float) -> GapEstimate:
    """The gap over a window of fewer than :data:`MIN_POINTS_STEP_RESAMPLING` points, with the t
    interval over the seeds' window means (each run's mean over the points finite in every run):
    paired or Welch's (:mod:`.welch`). A percentile bootstrap of 2-3 seeds holds the true gap far
    less often than its level says (2 seeds: about half of the time paired, 2/3 unpaired;
    tests/tools/test_stats.py), and the final validation gap is such a window (found in review,
    2026-12-06: its "95% interval" was the range of the two seeds' gaps)."""
    a, b, n_excl = paired_points(arm_m, base_m)
    n = a.shape[1]
    if n == 0:
        gap, why = point_gap(arm_m, base_m)
        return GapEstimate(gap, None, None, 0, None, n_excluded=n_excl, note=why)
    t = (paired_interval if paired else welch_interval)(a.mean(axis=1), b.mean(axis=1), ci=ci)
    note = f"{n} point(s), fewer than {MIN_POINTS_STEP_RESAMPLING}: t interval over the seeds' means"
    if t["note"]:
        note = f"{note}; {t['note']}"
    if n_excl:
        note = f"{n_excl} point(s) excluded: non-finite loss in some run; {note}"
    method = "t-paired" if paired else "t-welch"
    return GapEstimate(t["gap"], t["lo"], t["hi"], n, method, note=note, n_excluded=n_excl)


def _windowed(arm_names, base_names, series, widx, n_win, method, opt, label, kind):
    """Per-window estimates (list of dicts) for one arm vs the baseline."""
    out = []
    for w in range(n_win):
        sel = widx == w
        est = _estimate(
            _matrix(arm_names, series, sel),
            _matrix(base_names, series, sel),
            method,
            opt,
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


def _load(run_dirs: list[str], opt: Options) -> list[RunData]:
    """Read every run directory (each given once), with unique names; every unreadable run is
    reported at once."""
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
    return runs


def _group_and_align(
    runs: list[RunData], opt: Options
) -> tuple[dict[str, list[RunData]], str, Aligned, list[str]]:
    """Check the fingerprints, group the runs into arms, pick the baseline, align the runs on consumed
    tokens; returns ``(arms, baseline label, aligned, warnings)``."""
    warnings = check_fingerprints(runs, force=opt.force)
    warnings += check_config_changes(runs, force=opt.force)
    warnings += check_learning_rates(runs, force=opt.force)
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
    cpu = [r.name for r in runs if not r.on_gpu]
    if cpu:
        warnings.append(
            f"{', '.join(cpu)} ran on a CPU (mfu null in metrics.jsonl): their tokens/s, and any "
            "throughput ratio with them, mean nothing on a CPU shared with other work; measure "
            "throughput on dedicated GPUs (bench/train_throughput.py)"
        )
    return arms, base, aligned, warnings


@dataclass
class _Windows:
    """The token windows of an aligned grid: ``edges`` (tokens), ``n`` windows, the window index of each
    train point (``train``) and validation point (``valid``)."""

    edges: np.ndarray
    n: int
    train: np.ndarray
    valid: np.ndarray


def _windows(aligned: Aligned, opt: Options) -> _Windows:
    tokens = aligned.tokens
    edges = window_edges(
        tokens,
        n_windows=None if opt.window_tokens else opt.windows,
        window_tokens=opt.window_tokens,
    )
    vidx = assign_windows(aligned.val_tokens, edges) if aligned.val_tokens.size else np.zeros(0, int)
    return _Windows(edges=edges, n=len(edges) - 1, train=assign_windows(tokens, edges), valid=vidx)


def _grid_summary(aligned: Aligned, opt: Options) -> dict:
    tokens = aligned.tokens
    steps_per = np.diff(tokens)
    uniform = steps_per.size and np.all(steps_per == steps_per[0])
    return {
        "n_train_points": int(tokens.size),
        "first_tokens": int(tokens[0]),
        "last_tokens": int(tokens[-1]),
        "tokens_per_step": int(steps_per[0]) if uniform else None,
        "n_val_points": int(aligned.val_tokens.size),
        "max_tokens": opt.max_tokens,
    }


def _window_summary(win: _Windows) -> list[dict]:
    return [
        {
            "window": w,
            "lo_tokens": float(win.edges[w]),
            "hi_tokens": float(win.edges[w + 1]),
            "n_train_points": int((win.train == w).sum()),
            "n_val_points": int((win.valid == w).sum()),
        }
        for w in range(win.n)
    ]


def _arm_summaries(arms: dict[str, list[RunData]], base: str, aligned: Aligned, run_rows: list[dict]) -> dict:
    """Per arm: members, seeds, median tokens/s/GPU over its runs, non-finite counts, throughput ratio
    vs the baseline arm."""
    by_name = {row["name"]: row for row in run_rows}
    arm_rows = {}
    for label, members in arms.items():
        tps = np.concatenate([r.train["tokens_per_s_per_gpu"][aligned.train_mask[r.name]] for r in members])
        tps = tps[np.isfinite(tps)]
        arm_rows[label] = {
            "runs": [r.name for r in members],
            "seeds": [r.seed for r in members],
            "is_baseline": label == base,
            "on_cpu": any(not r.on_gpu for r in members),
            "median_tokens_per_s_per_gpu": _f(np.median(tps)) if tps.size else None,
            "nonfinite_train_loss": sum(by_name[r.name]["nonfinite"]["train_loss"] for r in members),
            "nonfinite_val_loss": sum(by_name[r.name]["nonfinite"]["val_loss"] for r in members),
            "skipped_steps": sum(by_name[r.name]["nonfinite"]["skipped_steps"] for r in members),
        }
    b_tps = arm_rows[base]["median_tokens_per_s_per_gpu"]
    for row in arm_rows.values():
        a = row["median_tokens_per_s_per_gpu"]
        row["throughput_ratio_vs_baseline"] = _f(a / b_tps) if (a is not None and b_tps) else None
        row["throughput_ratio_on_cpu"] = row["on_cpu"] or arm_rows[base]["on_cpu"]
    return arm_rows


def _method_warnings(method: str, n_arm: int, n_base: int) -> list[str]:
    """What the intervals of a comparison with ``n_arm`` and ``n_base`` seeds cannot show."""
    warnings = []
    if method in SEED_METHODS and min(n_arm, n_base) < FEW_SEEDS:
        text = f"only {n_arm} and {n_base} seeds: seed-resampled intervals are coarse and may undercover"
        if n_arm == n_base == 2 and method in ("seeds", "seeds-paired"):  # tests/tools/test_stats.py
            text += (
                "; at 2 seeds, resampling seeds alone gives "
                + (
                    "the range of the two seeds' gaps, which holds the true gap about half of the time"
                    if method == "seeds-paired"
                    else "[min arm - max base, max arm - min base], which holds the true gap about 2/3 "
                    "of the time"
                )
                + " (--bootstrap auto or hier resample steps as well)"
            )
        warnings.append(text)
    if method == "blocks" and (n_arm == 1 or n_base == 1):
        warnings.append(
            "one seed in an arm: intervals reflect step-to-step noise within the runs only, "
            "not seed-to-seed variation"
        )
    return warnings


def _gap_summary(prefix: str, windows: list[dict], final: dict | None, overall: dict | None) -> dict:
    """``{prefix}_windows``, the first and all significant windows, ``{prefix}_final`` and
    ``{prefix}_overall``."""
    return {
        f"{prefix}_windows": windows,
        f"{prefix}_first_significant_window": _first_significant(windows),
        f"{prefix}_significant_windows": [r["window"] for r in windows if r["significant"]],
        f"{prefix}_final": final,
        f"{prefix}_overall": overall,
    }


def _paired(arm: list[RunData], base: list[RunData]) -> bool:
    """Whether the two arms hold the same seeds, each once, at least two (both lists in seed order,
    as :func:`group_arms` sorts them): then run i of each is a pair (same initial weights and data)."""
    seeds = [r.seed for r in arm]
    return len(seeds) >= 2 and len(set(seeds)) == len(seeds) and seeds == [r.seed for r in base]


def _compare_arm(
    label: str,
    names: list[str],
    base: str,
    base_names: list[str],
    aligned: Aligned,
    win: _Windows,
    opt: Options,
    *,
    paired: bool = False,
) -> dict:
    """One arm vs the baseline: the train-loss gap per window, in the last window and over all points;
    the validation-loss gap likewise (final = the last validation point), when there is validation.
    ``paired``: run i of ``names`` and of ``base_names`` share a seed (:func:`_paired`): seeds are
    resampled in pairs and the final validation gap gets the paired t interval."""
    try:
        method = choose_method(len(names), len(base_names), opt.bootstrap, paired=paired)
    except StatsError as e:  # found in review, 2026-12-06: a traceback and exit code 1
        raise CompareError(f"--bootstrap {opt.bootstrap} for arm {label} against {base}: {e}") from None

    def estimate(series: dict[str, np.ndarray], sel: np.ndarray, key: str) -> dict:
        return _estimate(
            _matrix(names, series, sel),
            _matrix(base_names, series, sel),
            method,
            opt,
            _rng(opt.bootstrap_seed, label, key),
        ).to_dict()

    train = _windowed(names, base_names, aligned.loss, win.train, win.n, method, opt, label, "train")
    overall = estimate(aligned.loss, np.ones(aligned.tokens.shape, bool), "train-overall")
    cmp = {
        "arm": label,
        "baseline": base,
        "method": method,
        "paired": paired,
        "n_seeds": [len(names), len(base_names)],
        "warnings": _method_warnings(method, len(names), len(base_names)),
        **_gap_summary("train", train, train[-1], overall),
        **_gap_summary("valid", [], None, None),
        "valid_final_seed_interval": None,
    }
    if aligned.val_tokens.size:
        valid = _windowed(names, base_names, aligned.val_loss, win.valid, win.n, method, opt, label, "valid")
        last = np.zeros(aligned.val_tokens.shape, bool)
        last[-1] = True
        final = estimate(aligned.val_loss, last, "valid-final")
        final["tokens"] = int(aligned.val_tokens[-1])
        overall = estimate(aligned.val_loss, np.ones(aligned.val_tokens.shape, bool), "valid-overall")
        cmp.update(_gap_summary("valid", valid, final, overall))
        interval = paired_interval if paired else welch_interval
        cmp["valid_final_seed_interval"] = {
            **interval(_last(names, aligned.val_loss), _last(base_names, aligned.val_loss), ci=opt.ci),
            "tokens": int(aligned.val_tokens[-1]),
        }
    return cmp


def _last(names: list[str], series: dict[str, np.ndarray]) -> np.ndarray:
    """Each run's last value on the aligned grid (one per seed; NaN where not finite)."""
    return np.array([float(series[n][-1]) for n in names], dtype=np.float64)


def _seed_spreads(arms: dict[str, list[RunData]], aligned: Aligned, win: _Windows) -> dict:
    """Per arm with >= 2 seeds: the seed spread of the train loss per window, of the validation loss
    per window and at the last evaluation (``valid_final``, with its ``tokens``)."""
    out = {}
    for label, members in arms.items():
        if len(members) < 2:
            continue
        names = [r.name for r in members]
        row = {"runs": names, "seeds": [r.seed for r in members]}
        row["train_windows"] = seed_spread(names, aligned.loss, win.train, win.n)
        row["valid_windows"], row["valid_final"] = [], None
        if aligned.val_tokens.size:
            row["valid_windows"] = seed_spread(names, aligned.val_loss, win.valid, win.n)
            last = np.array([[aligned.val_loss[n][-1]] for n in names], dtype=np.float64)
            last[~np.isfinite(last)] = np.nan
            row["valid_final"] = {**spread_row(last), "tokens": int(aligned.val_tokens[-1])}
        out[label] = row
    return out


def compare(run_dirs: list[str], opt: Options) -> dict:
    """Load, check, align and compare the runs in ``run_dirs``.

    Raises :class:`CompareError` (with every reason found) when runs are refused. Returns a dict:
    ``warnings``, ``baseline``, ``fingerprints``, ``grid``, ``windows`` (token edges),
    ``runs`` (per-run facts: seed, commit, precision, non-finite counts, throughput),
    ``arms`` (members, median tokens/s/GPU, ratio vs baseline), ``comparisons`` (per non-baseline
    arm: per-window train and validation gaps with intervals, first significant window, final
    and overall gaps, ``paired`` (both arms hold the same seeds), ``valid_final_seed_interval``: the
    t interval of the final validation gap over the seeds, paired or Welch's, see :mod:`.welch`;
    empty when all runs are of one arm), ``seed_spread`` (per arm with >= 2
    seeds, see :mod:`.spread`), ``series`` (aligned per-run curves, for plots).
    """
    runs = _load(run_dirs, opt)
    arms, base, aligned, warnings = _group_and_align(runs, opt)
    win = _windows(aligned, opt)
    run_rows = [_run_summary(r, aligned) for r in runs]
    base_names = [r.name for r in arms[base]]
    comparisons = [
        _compare_arm(
            label,
            [r.name for r in members],
            base,
            base_names,
            aligned,
            win,
            opt,
            paired=_paired(members, arms[base]),
        )
        for label, members in arms.items()
        if label != base
    ]
    if len(arms) == 1:
        warnings.append(
            f"one arm ({base}, {len(base_names)} seeds): no precision comparison, seed spread only"
        )
    return {
        "warnings": warnings,
        "baseline": base,
        "fingerprints": {
            "config": sorted({r.config_fingerprint for r in runs}),
            "data_order": sorted({r.data_order_fingerprint for r in runs}),
        },
        "grid": _grid_summary(aligned, opt),
        "windows": _window_summary(win),
        "runs": run_rows,
        "arms": _arm_summaries(arms, base, aligned, run_rows),
        "comparisons": comparisons,
        "seed_spread": _seed_spreads(arms, aligned, win),
        "series": {
            "tokens": aligned.tokens,
            "loss": aligned.loss,
            "val_tokens": aligned.val_tokens,
            "val_loss": aligned.val_loss,
        },
    }
