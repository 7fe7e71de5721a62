"""The trainer and ``run.lock`` (CPU, in-process): a live run in the directory stops the start-up with
exit code 2 before anything is written; a dead one's lock is taken over; the locks are held for the
launch and released at its end; a lock taken over mid-run stops the run before its next save."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from training import checkpoint as ckpt
from training import run_lock as rl
from training.signals import EXIT_CONFIG, EXIT_DONE

from .conftest import metrics, take_over


@pytest.fixture(autouse=True)
def fast_lock(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(rl, "STALE_S", 3.0)
    monkeypatch.setattr(rl, "POLL_S", 0.05)


def foreign(**over) -> dict:
    rec = {"host": "node-other", "machine": "x", "pid": 4242, "slurm_job_id": "777", "token": "t", "beat": 0}
    rec.update(over)
    return rec


def train_beside_a_live_holder(train, cfg, lock):
    """``train(cfg)`` while another run's heartbeat rewrites ``lock`` every 0.2 s."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps(foreign()))
    stop = threading.Event()

    def beat():
        n = 0
        while not stop.wait(0.2):
            n += 1
            lock.write_text(json.dumps(foreign(beat=n)))

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        return train(cfg)
    finally:
        stop.set()
        t.join()


def test_a_live_run_in_the_directory_stops_the_start_up(make_cfg, train, tmp_path):
    run = tmp_path / "run"
    lock = run / rl.LOCK_NAME
    code, log = train_beside_a_live_holder(train, make_cfg(), lock)
    assert code == EXIT_CONFIG, log.text()
    assert (
        f"pretrain_llama: configuration error: runtime.output_dir {run} is in use by another run "
        "(host node-other, PID 4242, Slurm job 777; its lock"
    ) in log.text()
    assert not (run / "metrics.jsonl").exists() and not ckpt.complete_iterations(run / "checkpoints")
    assert json.loads(lock.read_text())["token"] == "t"  # the other run's lock is left as it was


def test_a_live_run_owning_a_checkpoint_dir_inside_its_run_dir_stops_another(make_cfg, train, tmp_path):
    """Run B (its own output directory) names run A's ``<output_dir>/checkpoints`` as its
    checkpoint.dir: A holds a lock there too (found in review, 2026-12-06: only A's run directory was
    locked, and B saved into A's checkpoints)."""
    theirs = tmp_path / "run" / "checkpoints"
    cfg = make_cfg(f"checkpoint.dir={theirs}", run="b")
    code, log = train_beside_a_live_holder(train, cfg, theirs / rl.LOCK_NAME)
    assert code == EXIT_CONFIG, log.text()
    assert f"configuration error: checkpoint.dir {theirs} is in use by another run" in log.text()
    assert not ckpt.complete_iterations(theirs)


def test_the_locks_are_held_for_the_launch_and_released(make_cfg, train, tmp_path, monkeypatch):
    from training.engine_cpu import CPUEngine

    elsewhere = tmp_path / "ckpts"
    seen = []
    real = CPUEngine.train_step

    def step(self, *args, **kwargs):
        seen.append(((tmp_path / "run" / rl.LOCK_NAME).is_file(), (elsewhere / rl.LOCK_NAME).is_file()))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CPUEngine, "train_step", step)
    code, log = train(make_cfg(f"checkpoint.dir={elsewhere}"))
    assert code == EXIT_DONE, log.text()
    assert seen == [(True, True)] * 8
    assert not (tmp_path / "run" / rl.LOCK_NAME).exists() and not (elsewhere / rl.LOCK_NAME).exists()
    assert "run lock" not in log.text()
    elsewhere = tmp_path / "run" / "checkpoints"  # the default layout: a lock in each as well
    seen.clear()
    code, log = train(make_cfg("training.train_iters=10"))  # a fresh start in the default layout
    assert code == EXIT_DONE and seen == [(True, True)] * 10, log.text()
    assert not (elsewhere / rl.LOCK_NAME).exists()


def test_a_crashed_launchs_lock_is_taken_over(make_cfg, train, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    me = rl.this_process()
    dead = foreign(host=me["host"], machine=me["machine"], pid=int(done.stdout), slurm_job_id=None)
    (run / rl.LOCK_NAME).write_text(json.dumps(dead))
    t0 = time.monotonic()
    code, log = train(make_cfg())
    assert code == EXIT_DONE, log.text()
    assert (
        f"run lock: WARNING: taking over {run / rl.LOCK_NAME} from host {me['host']}, PID {dead['pid']}"
        in log.text()
    )
    assert "(a process no longer running here)" in log.text() and time.monotonic() - t0 < 60
    assert not (run / rl.LOCK_NAME).exists()


def test_a_lock_taken_over_mid_run_stops_before_the_next_save(make_cfg, train, tmp_path, monkeypatch):
    from training.engine_cpu import CPUEngine

    monkeypatch.setattr(rl, "BEAT_S", 0.02)
    locks = []
    acquire = rl.RunLock.acquire.__func__

    def keep(cls, *args, **kwargs):
        locks.append(acquire(cls, *args, **kwargs))
        return locks[-1]

    monkeypatch.setattr(rl.RunLock, "acquire", classmethod(keep))
    real, steps = CPUEngine.train_step, []

    def step(self, *args, **kwargs):
        steps.append(1)
        if len(steps) == 6:  # after the save of step 4: another run takes the directory over
            take_over(locks[0], foreign())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CPUEngine, "train_step", step)
    code, log = train(make_cfg("checkpoint.save_interval=4", "training.train_iters=12"))
    assert code == EXIT_CONFIG, log.text()
    root = tmp_path / "run" / "checkpoints"
    assert ckpt.complete_iterations(root) == [4]  # the save of step 8 was not made
    events = [r for r in metrics(tmp_path / "run") if r["kind"] == "event" and r["event"] == "exit"]
    assert events[-1]["step"] == 8 and "exit code 2 at step 8 of 12 (another run took over" in log.text()
    assert events[-1]["detail"].startswith(
        f"another run took over the lock {tmp_path / 'run' / rl.LOCK_NAME} (host node-other, PID 4242, Slurm "
        "job 777) while this one ran"
    )
    assert "the checkpoint of step 8 was not saved" in events[-1]["detail"]
    assert json.loads((tmp_path / "run" / rl.LOCK_NAME).read_text())["token"] == "t"  # left to its holder
