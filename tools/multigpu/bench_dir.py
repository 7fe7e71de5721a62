"""Reading a ``bench/multi_gpu.sh`` output directory.

* ``runs.tsv``: one row per launch: label, run dir, processes, exit code, wall seconds, status (or
  ``skipped: why``), the exact command;
* ``bench.env``: ``key=value`` lines: N, the preempt and reshard steps, config, overrides, commit;
* ``device.json``: date (UTC), GPU names and count, versions, the NCCL / multicast variables as the
  workers see them (after ``launch/env.sh``);
* per run directory ``metrics.jsonl`` and ``run_meta.json`` (``training/metrics.py``, read through
  ``tools/rundir.py``), and per launch ``OUT/<label>.log``.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from rundir import meta_value, read_records

RUNS = ("ref", "dp", "tp", "seed", "preempt", "reshard")  # the run directories


class BenchDirError(ValueError):
    """``runs.tsv`` or ``bench.env`` cannot be read as the bench writes them (the report cannot start)."""


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise BenchDirError(
            f"{path} is not UTF-8 text (byte {err.start}): not written by bench/multi_gpu.sh"
        ) from None
    except OSError as err:
        raise BenchDirError(f"{path} cannot be read ({err.strerror})") from None


def env_int(env: dict[str, str], key: str, path: Path) -> int:
    """``env[key]`` as an int (missing or empty: 0).

    Raises:
        BenchDirError: the value is not an integer (names ``path`` and the key).
    """
    value = env.get(key, "").strip()
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise BenchDirError(f"{path}: {key}={value!r} is not an integer") from None


def read_bench_env(out: Path) -> dict[str, str]:
    """``bench.env`` as a dict (``key=value`` lines; a missing file gives an empty dict).

    Raises:
        BenchDirError: the file is not UTF-8 text or cannot be read.
    """
    env: dict[str, str] = {}
    path = out / "bench.env"
    if path.is_file():
        for line in _read_lines(path):
            key, sep, value = line.partition("=")
            if sep:
                env[key.strip()] = value
    return env


def read_runs(out: Path) -> dict[str, dict]:
    """``runs.tsv`` rows by label: ``run_dir``, ``nproc``, ``rc`` (int or None), ``wall_s``, ``status``,
    ``command``.

    Raises:
        BenchDirError: the file is not UTF-8 text or cannot be read.
    """
    rows: dict[str, dict] = {}
    path = out / "runs.tsv"
    if not path.is_file():
        return rows
    lines = _read_lines(path)
    for line in lines[1:]:
        parts = line.split("\t")
        if len(parts) < 7:
            parts += [""] * (7 - len(parts))
        label, run_dir, nproc, rc, wall, status, command = parts[:7]
        rows[label] = {
            "label": label,
            "run_dir": run_dir,
            "nproc": int(nproc) if nproc.isdigit() else None,
            "rc": int(rc) if rc.lstrip("-").isdigit() else None,
            "wall_s": int(wall) if wall.isdigit() else None,
            "status": status,
            "command": command,
        }
    return rows


def read_device(out: Path) -> dict:
    """``device.json`` as a dict (empty when it is missing or unreadable)."""
    try:
        return json.loads((out / "device.json").read_text())
    except (OSError, ValueError):
        return {}


def launch_segments(records: list[dict]) -> list[list[dict]]:
    """Split a run's records into launches: each ``start`` or ``resume`` event opens a new segment."""
    segments: list[list[dict]] = []
    for rec in records:
        if rec.get("kind") == "event" and rec.get("event") in ("start", "resume"):
            segments.append([rec])
        elif segments:
            segments[-1].append(rec)
        else:
            segments.append([rec])
    return segments


def train_losses(records: list[dict]) -> dict[int, float]:
    """step -> loss of the train records; the last record of a step wins (``training/metrics.py``)."""
    return {r["step"]: float(r["loss"]) for r in records if r.get("kind") == "train"}


def train_iters(run_dir: Path) -> int | None:
    """``training.train_iters`` of a run (from run_meta.json)."""
    return meta_value(run_dir, lambda m: int(m["config"]["training"]["train_iters"]))


def accumulation_per_rank(run_dir: Path) -> int | None:
    """Micro-batches per step per data-parallel rank of a run (from run_meta.json)."""

    def get(meta):
        tr, par = meta["config"]["training"], meta["config"]["parallel"]
        dp = meta["world_size"] // (par["tensor"] * par["pipeline"] * par["context"])
        return tr["global_batch_size"] // (tr["micro_batch_size"] * dp)

    return meta_value(run_dir, get)


def seed_of(run_dir: Path) -> int | None:
    """The training seed of a run (from run_meta.json)."""
    return meta_value(run_dir, lambda m: int(m["seed"]))


def cpu_initialized(run_dir: Path) -> bool:
    """True when the run initialised its weights on the CPU (training.use_cpu_initialization)."""
    return meta_value(run_dir, lambda m: m["config"]["training"].get("use_cpu_initialization") is True, False)


_ERR_RE = re.compile(r"\b[A-Za-z_.]*(Error|Exception)\b:?")


def log_message(log: Path) -> str:
    """The line of a launch log that says why it stopped: a configuration error or a resume without a
    usable checkpoint (with its detail lines),
    else the first exception line that is not torchrun's own, else the last lines."""
    if not log.is_file():
        return f"(no log {log.name})"
    lines = log.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if "configuration error" in line or "pretrain_llama: cannot resume" in line:
            detail = [line.strip()]
            for nxt in lines[i + 1 : i + 8]:
                if nxt.startswith(("  ", "If this change", "(data.identity", "(data.content")):
                    detail.append(nxt.strip())
                else:
                    break
            return " ".join(detail)
    for line in lines:
        if (
            _ERR_RE.search(line)
            and "ChildFailedError" not in line
            and "elastic" not in line
            and "SignalException" not in line
            and "warn" not in line.lower()
        ):
            return line.strip()
    return " | ".join(s.strip() for s in lines[-3:] if s.strip())


class BenchRuns:
    """The launches (``runs.tsv``) and the run directories' records and losses of one bench directory."""

    def __init__(self, out: Path):
        self.out = out
        self.rows = read_runs(out)
        self.records = {name: read_records(out / name) for name in RUNS}
        self.losses = {name: train_losses(recs) for name, recs in self.records.items()}

    def row(self, label: str) -> dict | None:
        return self.rows.get(label)

    def skipped(self, label: str) -> bool:
        """True when ``label`` was not launched (not in ``--runs``, skipped on CPU, or out of budget)."""
        row = self.rows.get(label)
        return row is None or row["status"].startswith("skipped")

    def finished(self, label: str) -> bool:
        """The run logged its final "done" exit event (it trained every step and saved), also when the
        launcher was then signalled during its teardown (a budget timeout arriving after the work)."""
        return any(
            r.get("kind") == "event"
            and r.get("event") == "exit"
            and str(r.get("detail", "")).startswith("done")
            for r in self.records.get(label, [])
        )

    def failure(self, label: str) -> str | None:
        """None when the launch exited 0, else why not (skipped, timeout, exit code + log message)."""
        row = self.rows.get(label)
        if row is None:
            return f"{label} was not run (not in runs.tsv)"
        if row["status"].startswith("skipped"):
            return f"{label} {row['status']}"
        if row["rc"] == 0 and (not row["status"].startswith(("timeout", "stopped")) or self.finished(label)):
            return None
        if row["status"].startswith("stopped"):
            return f"{label} was stopped by a SIGTERM/SIGINT to multi_gpu.sh (exit code {row['rc']})"
        return (
            f"{label} exited with code {row['rc']} ({row['status']}): "
            f"{log_message(self.out / (label + '.log'))}"
        )


def _median_after(records: list[dict], key: str, skip: int = 3) -> float | None:
    vals = [
        r[key] for r in records if r.get("kind") == "train" and r["step"] > skip and r.get(key) is not None
    ]
    return statistics.median(vals) if vals else None


def scaling(runs: BenchRuns) -> list[dict]:
    """tokens/s/GPU (median over the steps after the first 3) of ref, dp, tp; efficiency vs ref."""
    rows = []
    base = None
    for name in ("ref", "dp", "tp"):
        if runs.skipped(name):
            continue
        last = {}
        for r in runs.records[name]:
            if r.get("kind") == "train":
                last[r["step"]] = r
        recs = list(last.values())
        tps = _median_after(recs, "tokens_per_s_per_gpu")
        if name == "ref":
            base = tps
        mems = [r["peak_mem_gib"] for r in recs if r.get("peak_mem_gib") is not None]
        rows.append(
            {
                "run": name,
                "processes": runs.row(name)["nproc"],
                "tokens_per_s_per_gpu": tps,
                "step_time_s": _median_after(recs, "step_time_s"),
                "mfu": _median_after(recs, "mfu"),
                "peak_mem_gib": max(mems, default=None),
                "efficiency": (tps / base) if tps is not None and base else None,
            }
        )
    return rows


def per_step(runs: BenchRuns, steps: list[int]) -> list[dict]:
    """The training loss of every run at each step (None where a run did not log the step)."""
    return [{"step": s, **{name: runs.losses[name].get(s) for name in RUNS}} for s in steps]
