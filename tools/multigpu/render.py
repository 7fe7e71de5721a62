"""The multi-GPU report as markdown (``multi_gpu_report.md``) and as JSON-safe data (``.json``)."""

from __future__ import annotations

import math

from .checks import fmt


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _diff(a, b) -> str:
    if a is None or b is None:
        return "-"
    d = a - b
    return "0" if d == 0 else f"{d:+.2e}"


def _header(rep: dict) -> list[str]:
    gpus = rep["gpu_names"]
    gpu = f"{rep['gpu_count']} x {gpus[0]}" if gpus else f"none (CPU, gloo; {rep['device']})"
    s = rep["summary"]
    return [
        "# Multi-GPU validation: DP / TP parity, preemption and resume, reshard, scaling",
        "",
        f"- date: {rep['date_utc']}",
        f"- GPUs: {gpu}; N = {rep['nproc']} processes for the multi-process runs",
        f"- commit: {rep['commit'] or 'unknown'} ({rep['commit_source']})",
        f"- versions: python {rep['versions'].get('python_version')}, torch {rep['versions'].get('torch')}",
        "- launch environment (after launch/env.sh, as the workers inherit it): "
        + ", ".join(f"{k}={v}" for k, v in rep["launch_env"].items()),
        f"- config: {rep['config']} + `{rep['overrides']}` ({rep['train_iters']} steps)",
        f"- script: `{rep['script_cmd']}`",
        "",
        f"**{s['PASS']} PASS, {s['FAIL']} FAIL, {s['SKIP']} SKIP**",
    ]


def _checks(checks: list[dict]) -> list[str]:
    lines = ["## Checks", "", "| check | result | measured | bound |", "|---|---|---|---|"]
    for c in checks:
        lines.append(
            f"| {_cell(c['id'] + ': ' + c['title'])} | **{c['status']}** | {_cell(c['measured'])} | "
            f"{_cell(c['bound'])} |"
        )
    lines += [
        "",
        "```",
        *(f"{c['status']} {c['id']}: {c['measured']}" for c in checks),
        "```",
        "",
        "Why each bound:",
        "",
    ]
    seen: dict[str, str] = {}
    for c in checks:
        if c["why"]:
            lines.append(f"- `{c['id']}`: " + (f"as `{seen[c['why']]}`." if c["why"] in seen else c["why"]))
            seen.setdefault(c["why"], c["id"])
    return lines


def _launches(launches: list[dict]) -> list[str]:
    lines = [
        "## Launches (exact commands)",
        "",
        "| label | procs | exit | wall s | status | command |",
        "|---|---|---|---|---|---|",
    ]
    for r in launches:
        cmd = f"`{_cell(r['command'].strip())}`" if r["command"] else "-"
        lines.append(
            f"| {r['label']} | {r['nproc']} | {fmt(r['rc'])} | {fmt(r['wall_s'])} | "
            f"{_cell(r['status'])} | {cmd} |"
        )
    return lines


def _preempt_and_reshard(p: dict, r: dict) -> list[str]:
    lines = [
        "## Preemption",
        "",
        f"- exit codes: {p.get('exit_codes')} (expected [3, 0]); {p.get('sigterm')}",
        (
            f"- first launch stopped after step {p.get('stopped_after')}; the relaunch resumed from step "
            f"{p.get('resumed_from')} ({p.get('resume_detail')})"
        ),
        f"- steps missing: {p.get('missing')}; steps logged twice: {p.get('duplicates')}",
        "",
        "## Reshard (DP=N checkpoint, DP=1 resume)",
        "",
        f"- outcome: **{r.get('outcome')}**",
    ]
    if r.get("message"):
        lines.append(f"- message: {r['message']}")
    lines += [f"- log: {note}" for note in r.get("log_notes", [])]
    return lines


def _scaling(rows: list[dict], overlapped: bool) -> list[str]:
    lines = ["## Scaling (tokens/s/GPU, median over the steps after the first 3)", ""]
    if overlapped:
        lines += [
            (
                "Not a measurement: the runs were overlapped (--overlap), the figures below only show the "
                "wiring."
            ),
            "",
        ]
    lines += [
        "| run | processes | tokens/s/GPU | step time s | MFU | peak mem GiB | efficiency vs ref |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        tps = "-" if row["tokens_per_s_per_gpu"] is None else f"{row['tokens_per_s_per_gpu']:,.0f}"
        st = "-" if row["step_time_s"] is None else f"{row['step_time_s']:.3f}"
        mfu = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
        mem = "-" if row["peak_mem_gib"] is None else f"{row['peak_mem_gib']:.1f}"
        eff = "-" if row["efficiency"] is None else f"{row['efficiency']:.3f}"
        lines.append(f"| {row['run']} | {row['processes']} | {tps} | {st} | {mfu} | {mem} | {eff} |")
    return lines


def _per_step(rows: list[dict]) -> list[str]:
    lines = [
        "## Per-step training loss",
        "",
        "| step | ref loss | dp - ref | tp - ref | seed - ref | preempt - dp | reshard - dp |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ref = "-" if row["ref"] is None else f"{row['ref']:.6f}"
        lines.append(
            f"| {row['step']} | {ref} | {_diff(row['dp'], row['ref'])} | "
            f"{_diff(row['tp'], row['ref'])} | {_diff(row['seed'], row['ref'])} | "
            f"{_diff(row['preempt'], row['dp'])} | {_diff(row['reshard'], row['dp'])} |"
        )
    return lines


def render_markdown(rep: dict) -> str:
    """The report as markdown (what ``multi_gpu_report.md`` holds)."""
    sections = [
        _header(rep),
        _checks(rep["checks"]),
        _launches(rep["launches"]),
        _preempt_and_reshard(rep["preempt"], rep["reshard"]),
        _scaling(rep["scaling"], rep["overlapped"]),
        _per_step(rep["per_step"]),
    ]
    return "\n\n".join("\n".join(sec) for sec in sections) + "\n"


def json_safe(obj):
    """``obj`` with non-finite floats as strings (``inf``, ``nan``), for strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_safe(v) for v in obj]
    return obj
