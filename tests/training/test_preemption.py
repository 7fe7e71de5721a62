"""SIGTERM in the middle of a real run (subprocess), then resume; the time budget."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from training import checkpoint as ckpt
from training.signals import EXIT_PREEMPTED, EXIT_TIME_BUDGET

from .conftest import metrics, tiny_raw

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_saves_and_resume_continues(tiny_corpus, make_cfg, train, tmp_path):
    raw = tiny_raw(tmp_path / "run", tiny_corpus)
    raw["training"]["train_iters"] = 400
    raw["checkpoint"]["save_interval"] = 0  # only the preemption save
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "pretrain_llama.py"), "--config", str(cfg_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics_file = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if metrics_file.exists() and '"kind": "train", "step": 3,' in metrics_file.read_text():
            break
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_PREEMPTED, out
    recs = metrics(tmp_path / "run")
    last = max(r["step"] for r in recs if r["kind"] == "train")
    assert 3 <= last < 400
    assert recs[-1]["kind"] == "event" and recs[-1]["event"] == "exit" and "SIGTERM" in recs[-1]["detail"]
    root = tmp_path / "run" / "checkpoints"
    assert (root / ckpt.MARKER).read_text().strip() == str(last)
    assert ckpt.verify_checkpoint(ckpt.iter_dir(root, last)) is None
    summary = out.split("run summary:\n", 1)[1]
    assert (
        f"status       stopped at step {last} of 400 (preempted (SIGTERM)); it will resume: the same "
        f"command relaunched continues from {ckpt.iter_dir(root, last)}"
    ) in summary
    assert f"{last} this launch (steps 1-{last})" in summary

    # resume in-process with a time budget already spent: one step, save, exit code 4
    code, log = train(
        make_cfg("training.train_iters=400", "checkpoint.save_interval=0", "runtime.exit_duration_mins=0.001")
    )
    assert code == EXIT_TIME_BUDGET, log.text()
    recs = metrics(tmp_path / "run")
    events = [(r["event"], r["step"]) for r in recs if r["kind"] == "event"]
    assert ("resume", last) in events and events[-1] == ("exit", last + 1)
    assert recs[-1]["detail"].startswith("time budget")
    assert (
        f"stopped at step {last + 1} of 400 (time budget runtime.exit_duration_mins reached); it will "
        f"resume: the same command relaunched continues from {ckpt.iter_dir(root, last + 1)}"
    ) in log.text()
    assert f"1 this launch (steps {last + 1}-{last + 1}); {last + 1} of 400 done" in log.text()
    assert "throughput   - (one step this launch" in log.text()
    assert (root / ckpt.MARKER).read_text().strip() == str(last + 1)
    steps = [r["step"] for r in recs if r["kind"] == "train"]
    assert steps[-1] == last + 1 and steps.count(last + 1) == 1
