"""Markdown and JSON summaries of a comparison (the dict returned by ``analysis.compare``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

METHOD_TEXT = {
    "hier": "seeds resampled with replacement in each arm, and circular moving blocks of steps "
    "resampled within the window with the same indices for every run (paired steps)",
    "seeds": "seeds resampled with replacement in each arm (independently); per-run window means fixed",
    "blocks": "circular moving blocks of steps resampled within the window with the same indices for "
    "every run (paired steps: batch noise shared through the identical data order cancels)",
    "hier-paired": "seeds resampled with replacement in pairs (both arms hold the same seeds: one draw "
    "of seeds for both, so the runs of a seed, same initial weights and data, stay together), and "
    "circular moving blocks of steps resampled within the window with the same indices for every run",
    "seeds-paired": "seeds resampled with replacement in pairs (both arms hold the same seeds: one draw "
    "of seeds for both); per-run window means fixed",
    "t-paired": "windows of fewer than 5 points (a validation window, the final validation gap): the "
    "paired t interval over the per-seed differences of the runs' window means (n - 1 degrees of "
    "freedom), the seeds being too few for a bootstrap",
    "t-welch": "windows of fewer than 5 points (a validation window, the final validation gap): Welch's "
    "t interval over the runs' window means, the seeds being too few for a bootstrap",
}


def _tok(x) -> str:
    """Human token count: 1.5M, 2.05B."""
    if x is None:
        return "-"
    x = float(x)
    for div, suf in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.4g}{suf}"
    return f"{x:.4g}"


def _g(x, digits: int = 4) -> str:
    return "-" if x is None else f"{x:+.{digits}f}"


def _ci(d: dict | None) -> str:
    if d is None or d.get("lo") is None:
        return "n/a"
    return f"[{d['lo']:+.4f}, {d['hi']:+.4f}]"


def _cell(x) -> str:
    """Markdown table cell text from untrusted data: no pipes, no newlines, no HTML."""
    s = "-" if x is None else str(x)
    s = s.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")
    return s.replace("<", "&lt;").replace(">", "&gt;").replace("`", "'")


def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def _window_label(res: dict, w: int | None) -> str:
    if w is None:
        return "none"
    win = res["windows"][w]
    return f"window {w} ({_tok(win['lo_tokens'])}-{_tok(win['hi_tokens'])} tokens)"


def _window_table(res: dict, rows: list[dict], kind: str, header: list[str], cells) -> list[str]:
    """A markdown table with one row per window: window, tokens, points, then ``cells(row)``."""
    pts = "n_train_points" if kind == "train" else "n_val_points"
    out = [_row(["window", "tokens", "points", *header]), _row(["---"] * (3 + len(header)))]
    for r in rows:
        win = res["windows"][r["window"]]
        span = f"{_tok(win['lo_tokens'])}-{_tok(win['hi_tokens'])}"
        out.append(_row([str(r["window"]), span, str(win[pts]), *cells(r)]))
    return out


def _gap_table(res: dict, rows: list[dict], pct: str, kind: str) -> list[str]:
    return _window_table(
        res,
        rows,
        kind,
        ["gap (nats)", f"{pct} CI", "significant", "method", "note"],
        lambda r: [
            _g(r["gap"]),
            _ci(r),
            "**yes**" if r["significant"] else "no",
            _cell(r["method"]),
            _cell(r["note"]),
        ],
    )


def render_markdown(res: dict) -> str:
    """The summary as markdown: provenance (command, date, commits), runs, headline gaps,
    per-window tables, non-finite counts, throughput and the statistics method."""
    opt, tool = res["options"], res["tool"]
    pct = f"{round(100 * opt['ci'], 2):g}%"
    if res["comparisons"]:
        L = [f"# Precision comparison vs `{_cell(res['baseline'])}`", ""]
    else:
        L = [f"# Seed spread of `{_cell(res['baseline'])}` (one arm: no precision comparison)", ""]
    commit = tool["commit"] or "unknown"
    if tool.get("dirty"):
        commit += " (working tree had uncommitted changes)"
    L += [
        f"- Command: `{tool['command']}`",
        f"- Working directory: `{_cell(tool['cwd'])}`",
        f"- Date (UTC): {tool['date_utc']}",
        f"- compare_runs commit: `{commit}`",
        f"- Baseline arm: `{_cell(res['baseline'])}`",
        f"- Config fingerprint: {', '.join('`' + _cell(x) + '`' for x in res['fingerprints']['config'])}",
        "- Data-order fingerprint: "
        f"{', '.join('`' + _cell(x) + '`' for x in res['fingerprints']['data_order'])}",
    ]
    g = res["grid"]
    tps = f", {_tok(g['tokens_per_step'])} tokens per logged step" if g["tokens_per_step"] else ""
    L.append(
        f"- Aligned token grid: {g['n_train_points']} train points, {_tok(g['first_tokens'])}-"
        f"{_tok(g['last_tokens'])} tokens{tps}; {g['n_val_points']} validation points"
        + (f"; truncated at --max-tokens {g['max_tokens']}" if g["max_tokens"] is not None else "")
    )
    L.append(
        f"- Windows: {len(res['windows'])}"
        + (f" of {_tok(opt['window_tokens'])} tokens" if opt["window_tokens"] else " of equal width")
        + f"; bootstrap: {opt['n_boot']} replicates, {pct} percentile intervals, seed "
        f"{opt['bootstrap_seed']}, "
        f"method {opt['bootstrap']}, block length {opt['block_len'] or 'automatic (Politis-White)'}"
    )
    L += ["", "Gap = arm loss - baseline loss (nats); negative means the arm has the lower loss.", ""]
    warns = list(res["warnings"]) + [f"{c['arm']}: {w}" for c in res["comparisons"] for w in c["warnings"]]
    if warns:
        L += ["## Warnings", ""] + [f"- {_cell(w)}" for w in warns] + [""]

    L += ["## Runs", ""]
    L.append(
        _row(
            [
                "run",
                "arm",
                "seed",
                "backend",
                "world size",
                "commit",
                "train pts",
                "val pts",
                "superseded records",
                "events",
            ]
        )
    )
    L.append(_row(["---"] * 10))
    for r in res["runs"]:
        ev = ", ".join(f"{k}: {v}" for k, v in sorted(r["events"].items())) or "-"
        L.append(
            _row(
                [
                    _cell(r["name"]),
                    f"`{_cell(r['arm'])}`",
                    str(r["seed"]),
                    _cell(r["attention_backend"]),
                    str(r["world_size"]),
                    _cell(r["commit"] or "unknown"),
                    str(r["train_records"]),
                    str(r["valid_records"]),
                    str(r["records_replaced_by_later"]),
                    _cell(ev),
                ]
            )
        )
    L.append("")

    if res["comparisons"]:
        L += _headline(res, pct)
        L += _resolution(res, pct)
    for c in res["comparisons"]:
        L += _arm_sections(res, c, pct)
    for label, sp in res["seed_spread"].items():
        L += _spread_sections(res, label, sp)
    L += _nonfinite_and_throughput(res)
    L += _method(res, opt, pct)
    return "\n".join(L)


def _headline(res: dict, pct: str) -> list[str]:
    arms = res["arms"]
    L = ["## Headline", ""]
    L.append(
        _row(
            [
                "arm",
                "seeds (arm/base)",
                "CI method",
                "final-window train gap",
                f"{pct} CI",
                "whole-range train gap",
                f"{pct} CI",
                "first significant train window",
                "final val gap",
                f"{pct} CI",
                "first significant val window",
                "tokens/s/GPU ratio",
            ]
        )
    )
    L.append(_row(["---"] * 12))
    for c in res["comparisons"]:
        vf = c["valid_final"]
        L.append(
            _row(
                [
                    f"`{_cell(c['arm'])}`",
                    f"{c['n_seeds'][0]}/{c['n_seeds'][1]}",
                    c["method"]
                    + (
                        f" (final val: {vf['method']})"
                        if vf and vf.get("method") and vf["method"] != c["method"]
                        else ""
                    ),
                    _g(c["train_final"]["gap"]),
                    _ci(c["train_final"]),
                    _g(c["train_overall"]["gap"]),
                    _ci(c["train_overall"]),
                    _window_label(res, c["train_first_significant_window"]),
                    (_g(vf["gap"]) + f" @ {_tok(vf['tokens'])}") if vf else "no validation records",
                    _ci(vf),
                    _window_label(res, c["valid_first_significant_window"]) if vf else "-",
                    _ratio(arms[c["arm"]]),
                ]
            )
        )
    L.append("")
    return L


def _resolution(res: dict, pct: str) -> list[str]:
    """What the design can resolve: per arm, the t interval of the final validation gap over the
    seeds (paired where both arms hold the same seeds, else Welch's), its half-width (the smallest
    gap told from seed noise) and the verdict."""
    rows = [c for c in res["comparisons"] if c.get("valid_final_seed_interval")]
    if not rows:
        return []
    L = ["## Resolution of the design (final validation loss)", ""]
    L.append(
        _row(
            [
                "arm",
                "seeds (arm/base)",
                "final val gap",
                f"{pct} CI over seeds",
                "interval",
                "smallest resolvable gap (half-width)",
                "df",
                "seed s.d. (arm/base; of the differences)",
                "verdict",
            ]
        )
    )
    L.append(_row(["---"] * 9))
    for c in rows:
        w = c["valid_final_seed_interval"]
        if w["half_width"] is None:
            verdict = _cell(w["note"])
        elif w["indistinguishable"]:
            verdict = "statistically indistinguishable from the baseline (the interval covers 0)"
        else:
            verdict = "**differs** from the baseline (the interval excludes 0)"
        L.append(
            _row(
                [
                    f"`{_cell(c['arm'])}`",
                    f"{w['n_arm']}/{w['n_base']}",
                    _g(w["gap"]) + f" @ {_tok(w['tokens'])}",
                    "n/a" if w["lo"] is None else f"[{w['lo']:+.4f}, {w['hi']:+.4f}]",
                    "paired t" if "sd_diff" in w else "Welch t",
                    "n/a" if w["half_width"] is None else f"{w['half_width']:.4f} nats",
                    "-" if w["df"] is None else f"{w['df']:.2f}",
                    f"{_l4(w['sd_arm'])}/{_l4(w['sd_base'])}"
                    + (f"; {_l4(w['sd_diff'])}" if w.get("sd_diff") is not None else ""),
                    verdict,
                ]
            )
        )
    methods = sorted({c["valid_final_seed_interval"]["method"] for c in rows})
    L += [
        "",
        (
            f"Method: {' / '.join(methods)}, {pct}, on each seed's last validation loss (one value per "
            "run; the bootstrap above resamples steps as well). Paired where both arms hold the same seeds "
            "(the runs of a seed share initial weights and data: the interval is over the per-seed "
            "differences, valid whatever their correlation), else Welch's. The half-width is the smallest "
            "gap these seeds resolve: a true gap smaller than it cannot be told from seed-to-seed noise. "
            "Indistinguishable is not equivalent: the interval bounds are the gaps the data still allow."
        ),
        "",
    ]
    notes = [f"`{_cell(c['arm'])}`: {_cell(c['valid_final_seed_interval']['note'])}" for c in rows]
    notes = [n for n, c in zip(notes, rows) if c["valid_final_seed_interval"]["note"]]
    if notes:
        L += [f"- {n}" for n in notes] + [""]
    return L


def _arm_sections(res: dict, c: dict, pct: str) -> list[str]:
    """The per-window train and validation gap tables of one arm vs the baseline."""
    L = []
    L += [f"## Train-loss gap per window: `{_cell(c['arm'])}` - `{_cell(c['baseline'])}`", ""]
    L += _gap_table(res, c["train_windows"], pct, "train")
    first = _window_label(res, c["train_first_significant_window"])
    L += [
        "",
        (
            f"First significant window: {first}. "
            f"Significant windows: {c['train_significant_windows'] or 'none'}."
        ),
        "",
    ]
    L += [f"### Validation-loss gap per window: `{_cell(c['arm'])}` - `{_cell(c['baseline'])}`", ""]
    if c["valid_final"] is None:
        L += ["No validation records.", ""]
    else:
        L += _gap_table(res, c["valid_windows"], pct, "valid")
        vf, vo = c["valid_final"], c["valid_overall"]
        L += [
            "",
            f"Final validation gap (at {_tok(vf['tokens'])} tokens): {_g(vf['gap'])} nats, "
            f"{pct} CI {_ci(vf)}" + (f" ({_cell(vf['note'])})" if vf["note"] else "") + ". "
            f"Mean over all evaluations: {_g(vo['gap'])}, CI {_ci(vo)}. "
            f"First significant window: {_window_label(res, c['valid_first_significant_window'])}.",
            "",
        ]
    return L


def _spread_table(res: dict, rows: list[dict], seeds: list, kind: str) -> list[str]:
    return _window_table(
        res,
        rows,
        kind,
        ["mean loss", "seed s.d.", "range (max-min)", *(f"seed {s}" for s in seeds)],
        lambda r: [_l4(r["mean"]), _l4(r["sd"]), _l4(r["range"]), *(_l4(v) for v in r["per_seed"])],
    )


def _spread_sections(res: dict, label: str, sp: dict) -> list[str]:
    """Seed spread of one arm: per-window train (and validation) loss of each seed, s.d. and range."""
    seeds = sp["seeds"]
    L = [f"## Seed spread: `{_cell(label)}` ({len(seeds)} seeds)", ""]
    L += ["Train loss per window (each seed's mean over the window; s.d. across seeds, ddof=1):", ""]
    L += _spread_table(res, sp["train_windows"], seeds, "train") + [""]
    vf = sp["valid_final"]
    if vf is not None:
        L += ["Validation loss per window:", ""]
        L += _spread_table(res, sp["valid_windows"], seeds, "valid") + [""]
        per = ", ".join(f"seed {s}: {_l4(v)}" for s, v in zip(seeds, vf["per_seed"]))
        L += [
            f"Last validation loss (at {_tok(vf['tokens'])} tokens): {per}; s.d. {_l4(vf['sd'])}, "
            f"range {_l4(vf['range'])} nats.",
            "",
        ]
    return L


def _nonfinite_and_throughput(res: dict) -> list[str]:
    arms = res["arms"]
    L = ["## Non-finite counts", ""]
    L.append(
        _row(
            [
                "run",
                "arm",
                "seed",
                "non-finite train loss",
                "non-finite val loss",
                "inf grad norm",
                "skipped steps",
                "nonfinite_count (last logged)",
            ]
        )
    )
    L.append(_row(["---"] * 8))
    for r in res["runs"]:
        n = r["nonfinite"]
        L.append(
            _row(
                [
                    _cell(r["name"]),
                    f"`{_cell(r['arm'])}`",
                    str(r["seed"]),
                    str(n["train_loss"]),
                    str(n["val_loss"]),
                    str(n["grad_norm"]),
                    str(n["skipped_steps"]),
                    str(n["nonfinite_count_last"]),
                ]
            )
        )
    L += ["", "Non-finite losses are excluded from every mean and interval above.", ""]

    L += ["## Throughput", ""]
    L.append(_row(["arm", "runs", "median tokens/s/GPU", "ratio vs baseline"]))
    L.append(_row(["---"] * 4))
    for label, a in arms.items():
        L.append(
            _row(
                [
                    f"`{_cell(label)}`" + (" (baseline)" if a["is_baseline"] else ""),
                    str(len(a["runs"])),
                    _f1(a["median_tokens_per_s_per_gpu"]) + (" (CPU)" if a["on_cpu"] else ""),
                    _ratio(a),
                ]
            )
        )
    L += ["", "Median over every logged train step of the arm's runs in the compared range."]
    if any(a["on_cpu"] for a in arms.values()):
        L.append(
            "Runs marked CPU ran on a CPU: a tokens/s ratio measured on a CPU shared with other work "
            "means nothing (other processes take the cores); measure throughput on dedicated GPUs."
        )
    L.append("")
    return L


def _method(res: dict, opt: dict, pct: str) -> list[str]:
    L = ["## Method", ""]
    L += [
        (
            "- Runs are aligned on `consumed_tokens`: every run must log train (and validation) records "
            "at exactly the same token counts; misaligned grids are refused, never interpolated. For each "
            "(kind, step) the last record in `metrics.jsonl` wins (resumed runs)."
        ),
        (
            "- Per window, a point whose loss is not finite in any compared run is left out for all of "
            "them (paired); each run's mean over the remaining points is taken, an arm's value is the "
            "mean over its seeds, and the gap is arm minus baseline."
        ),
        f"- Intervals: {pct} percentile bootstrap, {opt['n_boot']} replicates.",
    ]
    used = set()
    for c in res["comparisons"]:
        used.add(c["method"])
        for key in ("train_windows", "valid_windows"):
            used.update(r["method"] for r in c[key] if r["method"])
        used.update(c[k]["method"] for k in ("valid_final", "train_final") if c[k] and c[k]["method"])
    for m in sorted(used):
        L.append(f"- `{m}`: {METHOD_TEXT[m]}.")
    L += [
        (
            "- Windows with fewer than 5 points get the t interval over the seeds' window means "
            "(several seeds: `t-paired`, `t-welch`) or no interval (one seed in an arm). Final "
            "validation gap: the last evaluation."
        ),
        (
            "- A window is significant when its interval excludes 0. Intervals are pointwise: over many "
            "windows some may exclude 0 by chance (about 5% each at 95% under no gap)."
        ),
        (
            "- Seed spread (arms with >= 2 seeds): per window, each seed's mean loss over the points "
            "finite in every run of the arm; s.d. (ddof=1) and range across seeds. A gap smaller than "
            "the spread cannot be told from seed noise."
        ),
        "",
    ]
    return L


def _ratio(arm: dict) -> str:
    """The arm's tokens/s/GPU ratio vs the baseline, marked when either ran on a CPU."""
    text = _f3(arm["throughput_ratio_vs_baseline"])
    return f"{text} (CPU: meaningless)" if arm["throughput_ratio_on_cpu"] and text != "-" else text


def _l4(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def _f1(x) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _f3(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    return x


def write_json(res: dict, path: Path) -> None:
    """Write the numbers of the comparison (everything but the raw curves) as strict JSON
    (non-finite floats become null)."""
    data = {k: v for k, v in res.items() if k != "series"}
    path.write_text(json.dumps(_jsonable(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
