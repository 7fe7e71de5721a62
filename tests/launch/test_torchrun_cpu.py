"""The launch path end to end: a 2-process torchrun run (gloo, CPU) of a tiny config through the launch path
trains, gets the time-limit signal as Slurm delivers it under srun, exits with the requeue code, is
relaunched (the requeue) and resumes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _train_records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    recs = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if rec.get("kind") == "train":
            recs.append(rec)
    return recs


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _signal_the_step(proc: subprocess.Popen) -> None:
    """SIGUSR1 to every process of the step, as slurmstepd passes srun's USR1 on with
    proctrack/cgroup: the node script, torchrun and the workers (with proctrack/pgid only the first
    two: the workers run in sessions of their own)."""
    for pid in [proc.pid, *_descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_two_process_torchrun_slurm_signal_requeue_resume(tmp_path):
    """torchrun has no SIGUSR1 handler: torchrun_node.sh starts it with USR1 ignored, or it would die
    of Slurm's signal and leave its workers saving with nothing waiting (found in review,
    2026-12-06)."""
    run = tmp_path / "run"
    exit_file = tmp_path / "exit.code"
    env = {
        **os.environ,
        "NPROC_PER_NODE": "2",
        "PYTHON": sys.executable,
        "PRETRAIN_EXIT_FILE": str(exit_file),
        "OMP_NUM_THREADS": "1",
        "MASTER_PORT": "29533",
    }
    args = [
        "bash",
        str(REPO / "launch" / "torchrun_node.sh"),
        "--config",
        "configs/tiny_cpu.yaml",
        f"runtime.output_dir={run}",
        "training.train_iters=24",
        "checkpoint.save_interval=1000",
        "validation.interval=1000",
    ]
    first = subprocess.Popen(
        args,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 240
    while len(_train_records(run)) < 5:
        assert first.poll() is None, first.stdout.read()
        assert time.time() < deadline, "training did not start in time"
        time.sleep(0.5)
    _signal_the_step(first)
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 3, out  # preempted after a save; the sbatch script requeues on 3
    stopped_at = max(r["step"] for r in _train_records(run))
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == str(stopped_at)
    assert stopped_at < 24

    second = subprocess.run(
        args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )  # the requeue
    assert second.returncode == 0, second.stdout + second.stderr
    events = [
        json.loads(line)
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if '"kind": "event"' in line or '"kind":"event"' in line
    ]
    resumes = [e for e in events if e["event"] == "resume"]
    assert resumes and resumes[-1]["step"] == stopped_at
    steps = sorted({r["step"] for r in _train_records(run)})
    assert steps == list(range(1, 25))  # every step exactly once across the two launches
