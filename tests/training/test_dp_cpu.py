"""Multi-process wiring on CPU (gloo), the part of the multi-GPU checks that runs without GPUs:
DP=2 with the same global batch gives bitwise the same per-step losses as one process, and a
checkpoint written at DP=2 resumes at DP=1 with bitwise the same continuation."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASE = ["--config", "configs/tiny_cpu.yaml", "training.train_iters=6", "validation.interval=1000"]


def _losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "train":
            out[rec["step"]] = rec["loss"]  # last record per step wins (resumed runs append)
    return out


def _run(nproc: int, run: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        cmd = [sys.executable, "pretrain_llama.py"]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "pretrain_llama.py",
        ]
    return subprocess.run(
        [*cmd, *BASE, f"runtime.output_dir={run}", *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_dp2_matches_dp1_and_resumes_at_dp1(tmp_path):
    one, two, mixed = tmp_path / "dp1", tmp_path / "dp2", tmp_path / "dp2_then_dp1"
    for nproc, run in ((1, one), (2, two)):
        res = _run(nproc, run)
        assert res.returncode == 0, res.stdout + res.stderr
    assert _losses(one) == _losses(two)  # bitwise, every step

    # DP=2 stops after its first step on the time budget (saves, exit 4 -> torchrun reports 1) ...
    first = _run(2, mixed, "runtime.exit_duration_mins=0.01")
    assert "time budget" in first.stdout + first.stderr
    saved = [p.name for p in (mixed / "checkpoints").iterdir() if p.name.startswith("iter_")]
    assert saved
    # ... and one process resumes from that checkpoint: the continuation equals the DP=1 run
    second = _run(1, mixed)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "[resume]" in second.stdout
    assert _losses(mixed) == _losses(one)
