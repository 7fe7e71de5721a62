"""Report of a ``bench/multi_gpu.sh`` output directory: DP and TP parity with one process, preemption
and resume at the same world size, resume at DP=1 from a DP=N checkpoint, scaling.

    python tools/multi_gpu_report.py OUT_DIR    # writes OUT_DIR/multi_gpu_report.md and .json, prints the md

Inputs, all written by ``bench/multi_gpu.sh`` (``tools/multigpu/bench_dir.py`` reads them): ``runs.tsv``
(one row per launch, with its exact command), ``bench.env`` (N, the preempt and reshard steps, config,
overrides, commit), ``device.json`` (date, GPUs, versions, the NCCL / multicast variables as the
workers see them), the run directories and the launch logs.

``BENCH_COMMIT`` in the environment overrides the commit (the GPU machine has no ``.git``).

Checks (``tools/multigpu/checks.py``; each with the tolerance of ``tools/multigpu/tolerances.py``, its
reason, the measured value and PASS/FAIL/SKIP): ``dp_vs_ref`` and ``dp_step1`` (DP=N vs DP=1),
``tp_vs_ref`` (TP=2 vs DP=1, bounded by the distance of the ``seed`` run, another random init, from
ref), ``preempt_exit_codes``, ``preempt_steps_once``, ``preempt_resume_exact`` and
``preempt_before_exact`` (vs the dp run), ``reshard`` (works within tolerance, or refuses with a clear
message). Throughput scaling is reported, not checked. Exit status: 0 when no check fails, 1
otherwise, 2 when OUT_DIR is unusable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from multigpu.bench_dir import (
    BenchDirError,
    BenchRuns,
    env_int,
    per_step,
    read_bench_env,
    read_device,
    scaling,
    train_iters,
)
from multigpu.checks import run_checks
from multigpu.render import json_safe, render_markdown


def _total_steps(runs: BenchRuns) -> int:
    """``training.train_iters`` of the first run that recorded it, else the last step logged by any run."""
    for name in ("ref", "dp", "preempt", "tp", "reshard"):
        total = train_iters(runs.out / name)
        if total:
            return total
    seen = [s for losses in runs.losses.values() for s in losses]
    return max(seen) if seen else 0


def _commit(env: dict[str, str]) -> tuple[str | None, str]:
    """The commit measured and where it comes from (``BENCH_COMMIT``, git HEAD, or unknown)."""
    commit = os.environ.get("BENCH_COMMIT") or env.get("bench_commit") or env.get("git_commit") or None
    if os.environ.get("BENCH_COMMIT") or env.get("bench_commit"):
        return commit, "BENCH_COMMIT"
    if not env.get("git_commit"):
        return commit, "unknown: set BENCH_COMMIT"
    modified = env.get("git_modified_files", "0")
    return commit, "git HEAD" + (
        f", {modified} tracked file(s) modified" if modified not in ("", "0") else ""
    )


def build_report(out: str | os.PathLike) -> dict:
    """Read a bench directory and return the report as a JSON-able dict (see the module docstring).

    Raises:
        BenchDirError: ``runs.tsv`` / ``bench.env`` is not UTF-8 text or a number in ``bench.env``
            is not an integer.
    """
    out = Path(out)
    env = read_bench_env(out)
    device = read_device(out)
    runs = BenchRuns(out)
    total = _total_steps(runs)
    nproc = env_int(env, "nproc", out / "bench.env")
    is_cpu = env.get("device", device.get("device")) == "cpu"
    result = run_checks(
        runs,
        total=total,
        nproc=nproc,
        is_cpu=is_cpu,
        preempt_at=env_int(env, "preempt_at", out / "bench.env"),
        reshard_step=env_int(env, "reshard_step", out / "bench.env"),
    )
    checks = result["checks"]
    commit, commit_source = _commit(env)
    return {
        "date_utc": device.get("date_utc"),
        "device": device.get("device", env.get("device")),
        "gpu_count": device.get("gpu_count"),
        "gpu_names": device.get("gpu_names", []),
        "commit": commit,
        "commit_source": commit_source,
        "versions": {k: device.get(k) for k in ("python_version", "torch", "megatron_core_found")},
        "launch_env": device.get("launch_env", {}),
        "nproc": nproc,
        "train_iters": total,
        "config": env.get("config"),
        "overrides": env.get("overrides"),
        "script_cmd": env.get("script_cmd"),
        "launches": list(runs.rows.values()),
        "checks": checks,
        "summary": {s: sum(c["status"] == s for c in checks) for s in ("PASS", "FAIL", "SKIP")},
        "preempt": result["preempt"],
        "reshard": result["reshard"],
        "scaling": scaling(runs),
        "overlapped": env.get("overlap") == "1",
        "per_step": per_step(runs, list(range(1, total + 1))),
    }


def main(argv: list[str] | None = None) -> int:
    """Write ``OUT/multi_gpu_report.md`` and ``.json``, print the markdown; 0 if no check failed, else 1."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the output directory of bench/multi_gpu.sh")
    args = p.parse_args(argv)
    out = Path(args.out)
    if not (out / "runs.tsv").is_file():
        print(
            f"multi_gpu_report: {out / 'runs.tsv'} not found: not a bench/multi_gpu.sh output directory",
            file=sys.stderr,
        )
        return 2
    try:
        rep = build_report(out)
    except BenchDirError as err:
        print(f"multi_gpu_report: {err}", file=sys.stderr)
        return 2
    (out / "multi_gpu_report.json").write_text(json.dumps(json_safe(rep), indent=1) + "\n")
    md = render_markdown(rep)
    (out / "multi_gpu_report.md").write_text(md)
    print(md, end="")
    return 1 if rep["summary"]["FAIL"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
