"""Out of GPU memory on one rank of two (torchrun, gloo, CPU): that rank says where and what to change on
its stderr and exits with code 6 without joining the collective call the other rank waits in; the
launcher ends the other; the newest complete checkpoint stays the one to resume from.

The out-of-memory error is injected by a wrapper script that patches ``CPUEngine.train_step`` on rank 1
before it runs ``pretrain_llama.main`` (the product has no hook for it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

WRAPPER = """
import os, sys
sys.path.insert(0, {repo!r})
import torch
from training.engine_cpu import CPUEngine

real, calls = CPUEngine.train_step, []


def flaky(self, *args, **kwargs):
    calls.append(1)
    if os.environ["RANK"] == "1" and len(calls) == 3:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    return real(self, *args, **kwargs)


CPUEngine.train_step = flaky
sys.argv[0] = "pretrain_llama.py"
import pretrain_llama

raise SystemExit(pretrain_llama.main())
"""


@pytest.mark.slow
def test_out_of_memory_on_one_rank_exits_6_without_a_hang(tmp_path):
    wrapper = tmp_path / "oom_on_rank1.py"
    wrapper.write_text(WRAPPER.format(repo=str(REPO)))
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PRETRAIN_EXIT_FILE": str(tmp_path / "exit.code")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(wrapper)]
    args = ["--config", "configs/tiny_cpu.yaml", "training.train_iters=6", "checkpoint.save_interval=2"]
    t0 = time.perf_counter()
    res = subprocess.run(
        [*cmd, *args, "validation.interval=1000", f"runtime.output_dir={run}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    seconds = time.perf_counter() - t0
    text = res.stdout + res.stderr
    assert res.returncode != 0, text
    newest = run / "checkpoints" / "iter_0000002"
    oom = "out of GPU memory in step 3 (CUDA out of memory. Tried to allocate 2.00 GiB.)"
    assert f"pretrain_llama: rank 1: {oom}" in res.stderr, text
    assert f"relaunched with the change, the run resumes from {newest}" in res.stderr, text
    # rank 1's own exit code, as torchrun reports the failed worker, and in the exit file for the
    # launchers (rank 0, waiting in the step's collective call when the launcher ended it, wrote none)
    assert "exitcode  : 6" in res.stderr or "exitcode: 6" in res.stderr, text
    assert (tmp_path / "exit.code").read_text() == "6\n"
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert seconds < 120, f"took {seconds:.0f} s: a rank hung after the error"
