"""SIGTERM and Ctrl-C in the middle of a real run (subprocess), then resume; the time budget."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from training import checkpoint as ckpt
from training.signals import EXIT_PREEMPTED, EXIT_TIME_BUDGET

from .conftest import metrics, tiny_raw

REPO = Path(__file__).resolve().parents[2]


def child_env() -> dict:
    """The environment of a single-process ``pretrain_llama.py`` child (no torchrun variables)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def signal_a_run_at_step_3(
    tiny_corpus, tmp_path, sig, *, stderr=subprocess.STDOUT, overrides=(), train_iters=400, timeout=120
):
    """Start a ``train_iters``-step tiny run (``overrides`` on top) in a subprocess, send ``sig`` once
    step 3 is logged, wait for it: (exit code, stdout, stderr, the command)."""
    from training.config import apply_overrides

    raw = apply_overrides(tiny_raw(tmp_path / "run", tiny_corpus), list(overrides))
    raw["training"]["train_iters"] = train_iters
    raw["checkpoint"]["save_interval"] = 0  # only the preemption save
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, str(REPO / "pretrain_llama.py"), "--config", str(cfg_path)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=stderr, text=True)
    metrics_file = tmp_path / "run" / "metrics.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if metrics_file.exists() and '"kind": "train", "step": 3,' in metrics_file.read_text():
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err, cmd


def _check_saved_at_exit(tmp_path, detail: str) -> int:
    """The run stopped after a step >= 3 with an exit event naming ``detail`` and a complete
    checkpoint of that step; returns the step."""
    recs = metrics(tmp_path / "run")
    last = max(r["step"] for r in recs if r["kind"] == "train")
    assert 3 <= last < 400
    assert recs[-1]["kind"] == "event" and recs[-1]["event"] == "exit" and detail in recs[-1]["detail"]
    root = tmp_path / "run" / "checkpoints"
    assert (root / ckpt.MARKER).read_text().strip() == str(last)
    assert ckpt.verify_checkpoint(ckpt.iter_dir(root, last)) is None
    return last


def test_sigterm_saves_and_resume_continues(tiny_corpus, make_cfg, train, tmp_path):
    code, out, _, _ = signal_a_run_at_step_3(tiny_corpus, tmp_path, signal.SIGTERM)
    assert code == EXIT_PREEMPTED, out
    last = _check_saved_at_exit(tmp_path, "preempted (SIGTERM)")
    root = tmp_path / "run" / "checkpoints"
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


def test_first_ctrl_c_finishes_the_step_saves_and_exits_3(tiny_corpus, tmp_path):
    code, out, err, _ = signal_a_run_at_step_3(tiny_corpus, tmp_path, signal.SIGINT, stderr=subprocess.PIPE)
    assert code == EXIT_PREEMPTED, out + err
    assert "Traceback" not in out + err and "KeyboardInterrupt" not in out + err
    assert (
        "pretrain_llama: Ctrl-C: finishing this step, then saving a checkpoint and exiting with code 3; "
        "press Ctrl-C again to stop at once without saving\n"
    ) in err
    _check_saved_at_exit(tmp_path, "interrupted (SIGINT, Ctrl-C)")


SECOND_CTRL_C = """
import time
from training.signals import StopFlags
flags = StopFlags(exit_duration_mins=None)
flags.install()
print("ready", flush=True)
while not flags.local_reason():
    time.sleep(0.01)
print("stopping with", flags.local_reason(), flags.describe(flags.local_reason()), flush=True)
time.sleep(60)  # a long save; the second Ctrl-C must end it at once
print("not reached", flush=True)
"""


def test_second_ctrl_c_stops_at_once():
    proc = subprocess.Popen(
        [sys.executable, "-c", SECOND_CTRL_C],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline() == "stopping with 3 interrupted (SIGINT, Ctrl-C)\n"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    assert time.monotonic() - t0 < 5
    assert proc.returncode == -signal.SIGINT  # the shell reports 130
    assert out == ""
    assert err == (
        "pretrain_llama: Ctrl-C: finishing this step, then saving a checkpoint and exiting with code 3; "
        "press Ctrl-C again to stop at once without saving\n"
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
@pytest.mark.parametrize("stage", ["build_data", "load"])
def test_a_signal_during_start_up_exits_3_at_once(make_cfg, train, tmp_path, monkeypatch, sig, stage):
    """Found in review (2026-12-06): SIGTERM or SIGUSR1 before the loop (here while the data is built,
    or while a checkpoint loads: minutes for an 8B resume) ended the process by the signal's default
    action (143; torchrun's launcher 1), which the launchers do not requeue. Now: exit code 3 at once,
    one line, nothing written to the checkpoints; the relaunch resumes."""
    import training.trainer as trainer_module
    from training.engine_cpu import CPUEngine

    code, log = train(make_cfg("training.train_iters=4"))  # a checkpoint of step 4 to resume
    assert code == 0, log.text()
    root = tmp_path / "run" / "checkpoints"
    before = sorted(p.name for p in root.iterdir())
    owner, name = (trainer_module, "build_data") if stage == "build_data" else (CPUEngine, "load")
    real = getattr(owner, name)

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), sig)  # the handler runs at the next bytecode: inside the start-up
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, signalled)
    code, log = train(
        make_cfg(
            "training.train_iters=8", "checkpoint.allow_config_change=[training.train_iters,data.identity]"
        )
    )
    assert code == EXIT_PREEMPTED, log.text()
    text = (
        f"preempted ({signal.Signals(sig).name}) during start-up, before this launch's first step: nothing "
        f"to save; the same command relaunched resumes from the newest complete checkpoint in {root}"
    )
    # the metrics file is open by then: the exit event, at the step being resumed
    assert metrics(tmp_path / "run")[-1] == {"kind": "event", "step": 4, "event": "exit", "detail": text}
    assert f"[exit] step 4: {text}" in log.text()
    assert sorted(p.name for p in root.iterdir()) == before
    assert signal.getsignal(sig) is signal.SIG_DFL  # the handlers found, given back
    monkeypatch.undo()
    code, log = train(
        make_cfg(
            "training.train_iters=8", "checkpoint.allow_config_change=[training.train_iters,data.identity]"
        )
    )
    assert code == 0, log.text()
    events = [(r["event"], r["step"]) for r in metrics(tmp_path / "run") if r["kind"] == "event"]
    assert [e for e in events if e[0] == "resume"][-1] == ("resume", 4) and events[-1] == ("exit", 8)


# pretrain_llama.main with a signal sent to itself during the config load (after it: a Ctrl-C, with
# torch made unimportable, as an import interrupted midway leaves it) or while the Trainer is built
BEFORE_THE_TRAINER = """
import os, signal, sys
import training.config, training.trainer
mode, where = sys.argv[1], sys.argv[2]
real_load, real_init = training.config.load_config, training.trainer.Trainer.__init__
def load_config(*args, **kwargs):
    cfg = real_load(*args, **kwargs)
    if where == "config":
        if mode == "SIGINT":
            sys.modules["torch"] = None  # any import of torch from here on raises ImportError
        os.kill(os.getpid(), getattr(signal, mode))
    return cfg
def init(self, *args, **kwargs):
    if where == "trainer":
        os.kill(os.getpid(), getattr(signal, mode))
    real_init(self, *args, **kwargs)
training.config.load_config = load_config
training.trainer.Trainer.__init__ = init
import pretrain_llama
code = pretrain_llama.main(["--config", "configs/tiny_cpu.yaml", f"runtime.output_dir={sys.argv[3]}"])
print("handlers", *(signal.getsignal(s) is signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGUSR1)))
sys.exit(code)
"""


@pytest.mark.parametrize("where", ["config", "trainer"])
@pytest.mark.parametrize("mode", ["SIGTERM", "SIGUSR1", "SIGINT"])
def test_a_stop_before_the_trainer_exits_with_its_code_and_one_line(tmp_path, mode, where):
    """Found in review (2026-12-06): SIGTERM or SIGUSR1 in the first seconds (the imports, the config
    load: before the trainer's start-up handler) ended the process by the default action (143, 138),
    with no exit-code file; a Ctrl-C there wrote its exit code through a module that imported torch
    again, after the interrupted import: a second traceback and exit code 1. They are now recorded
    there and acted on after the config load, or by the trainer's start-up (training.signals
    install_deferred_stop): exit code 3 (130 for Ctrl-C), one line, nothing trained."""
    exit_file, run = tmp_path / "exit_code", tmp_path / "run"
    env = {**child_env(), "PRETRAIN_EXIT_FILE": str(exit_file), "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-c", BEFORE_THE_TRAINER, mode, where, str(run)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    want = 130 if mode == "SIGINT" else EXIT_PREEMPTED
    assert res.returncode == want, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and res.stdout.endswith("handlers True True\n"), res.stdout
    assert exit_file.read_text() == f"{want}\n"
    assert not (run / "checkpoints").exists()
    if mode == "SIGINT":
        assert res.stderr == "pretrain_llama: stopped by Ctrl-C; nothing saved since the last checkpoint\n"
    elif where == "config":
        assert res.stderr == (
            f"pretrain_llama: preempted ({mode}) during start-up, before the trainer started: nothing to "
            "save; the same command relaunched resumes from its newest complete checkpoint\n"
        )
    else:
        assert res.stderr.endswith(
            f"pretrain_llama: preempted ({mode}) during start-up, before this launch's first step: nothing "
            "to save; the same command relaunched resumes from step 0 (no checkpoint yet)\n"
        )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_inside_an_import_is_raised_at_the_next_stage(tmp_path, monkeypatch, sig):
    """Found in review (2026-12-06): a Ctrl-C raised inside ``torch._dynamo``'s import during the
    start-up was swallowed by a library's ``except`` and the run crashed later on the half-imported
    module. Inside an import the start-up handlers only record the signal; the next stage raises it."""
    from training.signals import StartupStop, end_startup_stop, install_startup_stop, restore_handlers

    (tmp_path / "swallowing_module.py").write_text(
        "import os, signal\n"
        "try:\n"
        f"    os.kill(os.getpid(), {int(sig)})\n"
        "    x = sum(range(1000))  # the handler runs by here\n"
        "except BaseException:  # a library that takes everything\n"
        "    pass\n"
        "DONE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # Python's own SIGINT handler, as a launch from a terminal has it; a process started by a script's
    # `cmd &` inherits SIGINT ignored, which install_startup_stop leaves alone (the next test). Found
    # on 2026-12-06: this test failed in a suite started in the background.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = install_startup_stop()
    try:
        import swallowing_module

        assert swallowing_module.DONE  # the import completed: nothing was raised inside it
        with pytest.raises(KeyboardInterrupt if sig == signal.SIGINT else StartupStop):
            end_startup_stop()
    finally:
        restore_handlers(previous)
        signal.signal(signal.SIGINT, inherited)
        sys.modules.pop("swallowing_module", None)


def test_an_inherited_ignored_sigint_stays_ignored_during_start_up():
    """A launch started by a script's ``cmd &`` (a shell without job control) inherits SIGINT ignored:
    :func:`install_startup_stop` takes SIGTERM and SIGUSR1 and leaves SIGINT ignored, and
    :func:`end_startup_stop` gives it back ignored."""
    from training.signals import end_startup_stop, install_startup_stop, restore_handlers

    inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous = install_startup_stop()
    try:
        assert signal.SIGINT not in previous and signal.SIGTERM in previous
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # a handler, if there were one, would have run by here
        end_startup_stop()  # nothing recorded, nothing raised
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        restore_handlers(previous)
        signal.signal(signal.SIGINT, inherited)
