"""bench/trajectory_session.py's device calls on CPU, with tests/bench/fake_pretrain.py standing in for
the trainer: detached lanes that outlive a call, runs of one GPU in sequence, a lost process resumed
by the next call, a SIGTERM (save, exit 3, resumed), the stop time, the comparison and the archive."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import trajectory_session as TS  # noqa: E402
from trajectory import budget as B  # noqa: E402
from trajectory import lanes as L  # noqa: E402

FAKE = Path(__file__).with_name("fake_pretrain.py")
BLEND = [{"prefix": "cache/data/default/kjv_train", "weight": 3}, {"prefix": "cache/data/x", "weight": 5}]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def write_plan(root: Path, *, gpus: int, arms, seeds, iters: int, session_start: float | None = None) -> dict:
    """plan.json as the first call writes it, with the fake trainer and 10-step validation."""
    plan = B.make_plan(
        gpus=gpus,
        arms=arms,
        seeds=seeds,
        train_iters=iters,
        min_tokens=1,
        val_every_tokens=10 * 65_536,
        output_root=str(root),
    )
    d = TS.plan_record(
        plan,
        root,
        session_start=time.time() if session_start is None else session_start,
        code_root=REPO,
        site=None,
        python=sys.executable,
        trainer_argv=[sys.executable, str(FAKE)],
        corpus_name="extended",
        corpus=BLEND,
        epochs=None,
        commit="abc1234",
        setup_s=0.0,
    )
    L.write_json(root / "plan.json", d)
    return d


def set_call_s(root: Path, seconds: float) -> None:
    plan = json.loads((root / "plan.json").read_text())
    plan["budget"]["call_s"] = seconds
    L.write_json(root / "plan.json", plan)


def call(root: Path, out: Path, *, step_s: float = 0.01) -> subprocess.CompletedProcess:
    env = {**os.environ, "FAKE_STEP_S": str(step_s)}
    env.pop("OUT", None)
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "trajectory_session.py"), str(root), "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "session"
    yield r
    for pid_file in (r / "lanes").glob("*.pid"):  # never leave a lane behind
        try:
            os.killpg(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass


def train_steps(run_dir: Path) -> list[int]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sorted({r["step"] for r in recs if r["kind"] == "train"})


def wait_for(pred, timeout=20.0):
    t = time.time()
    while not pred():
        assert time.time() - t < timeout, "timed out"
        time.sleep(0.05)


def test_runs_survive_calls_then_compare_and_pack(root, tmp_path):
    plan = write_plan(root, gpus=2, arms=("bf16", "fp8"), seeds=(1, 2), iters=40)
    lanes = {g: [r["name"] for r in plan["runs"] if r["gpu"] == g] for g in (0, 1)}
    assert lanes == {0: ["bf16_seed1", "bf16_seed2"], 1: ["fp8_seed1", "fp8_seed2"]}
    set_call_s(root, 0.5)
    first = call(root, tmp_path / "out1", step_s=0.02)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().endswith("call again") and "lanes started on GPU(s) 0, 1" in first.stdout
    assert L.lane_alive(root, 0) and L.lane_alive(root, 1)  # the call returned, the lanes go on
    assert (tmp_path / "out1" / "trajectory.tgz").is_file()

    set_call_s(root, 40)
    second = call(root, tmp_path / "out2")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip().endswith("done") and "lanes started" not in second.stdout
    for run in plan["runs"]:
        st = L.run_status(root, run["name"])
        assert st["state"] == "done" and st["exit_code"] == 0 and st["launches"] == 1
        d = Path(run["output_dir"])
        assert train_steps(d) == list(range(1, 41))
        meta = json.loads((d / "run_meta.json").read_text())
        assert meta["env"]["gpu"] == str(run["gpu"]) and meta["env"]["cache"] == str(d / "data_cache")
        assert json.loads(meta["corpus"]) == BLEND and meta["commit"] == "abc1234"
        log = (d / "train.log").read_text()
        assert "runtime.exit_duration_mins=" in log and "training.train_iters=40" in log
    summary = (root / "compare" / "summary.md").read_text()
    assert "Resolution of the design" in summary and "attn=fp8,proj=bf16" in summary
    with tarfile.open(tmp_path / "out2" / "trajectory.tgz") as tar:
        names = set(tar.getnames())
    assert {
        "plan.json",
        "compare/summary.md",
        "runs/fp8_seed2/metrics.jsonl",
        "runs/bf16_seed1/train.log",
    } <= names
    assert not any("checkpoint" in n for n in names)
    assert "done" in (tmp_path / "out2" / "progress.txt").read_text()


def test_a_lost_run_and_a_sigterm_resume_in_the_next_call(root, tmp_path):
    plan = write_plan(root, gpus=2, arms=("bf16", "fp8"), seeds=(1,), iters=120)
    set_call_s(root, 0.3)
    assert call(root, tmp_path / "o1").returncode == 0
    bf16, fp8 = (Path(r["output_dir"]) for r in plan["runs"])

    def saved(d):
        p = d / "checkpoint.json"
        return p.is_file() and json.loads(p.read_text())["step"] >= 20

    wait_for(lambda: saved(bf16) and saved(fp8))
    # GPU 0: lane and trainer killed outright (a lost machine process); GPU 1: SIGTERM to the lane
    st0 = L.run_status(root, "bf16_seed1")
    lane0 = int(L.lane_pid_path(root, 0).read_text())
    os.kill(lane0, signal.SIGKILL)
    os.kill(st0["pid"], signal.SIGKILL)
    os.kill(int(L.lane_pid_path(root, 1).read_text()), signal.SIGTERM)
    wait_for(lambda: L.run_status(root, "fp8_seed1")["state"] == "preempted")
    wait_for(lambda: not L.pid_alive(st0["pid"]) and not L.lane_alive(root, 1))
    assert L.run_status(root, "bf16_seed1")["state"] == "running"  # what the killed lane left
    cut = {d: max(train_steps(d)) for d in (bf16, fp8)}
    assert all(c < 120 for c in cut.values())

    set_call_s(root, 40)
    res = call(root, tmp_path / "o2")
    assert res.returncode == 0 and res.stdout.strip().endswith("done"), res.stdout + res.stderr
    assert "lanes started on GPU(s) 0, 1" in res.stdout
    for name, d in (("bf16_seed1", bf16), ("fp8_seed1", fp8)):
        st = L.run_status(root, name)
        assert st["state"] == "done" and st["launches"] == 2
        assert train_steps(d) == list(range(1, 121))
        events = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        assert [e["event"] for e in events if e["kind"] == "event"].count("resume") == 1


def test_no_start_after_the_stop_time(root, tmp_path):
    plan = write_plan(root, gpus=1, arms=("bf16",), seeds=(1,), iters=10, session_start=time.time() - 1e5)
    set_call_s(root, 20)
    res = call(root, tmp_path / "o")
    assert res.returncode == 0 and res.stdout.strip().endswith("done"), res.stdout + res.stderr
    assert L.run_status(root, plan["runs"][0]["name"])["state"] == "no_time"
    assert not Path(plan["runs"][0]["output_dir"], "metrics.jsonl").exists()


def test_a_call_without_a_plan_and_without_gpus_refuses(root, tmp_path, monkeypatch):
    monkeypatch.setattr(TS, "detect_gpus", lambda: 0)
    assert TS.main([str(root), "--out", str(tmp_path / "o")]) == 2
    assert not (root / "plan.json").exists() and (root / "session.json").exists()
