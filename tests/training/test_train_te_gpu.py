"""Transformer Engine projections in the megatron-core engine on a CUDA GPU (run on the H200 with the
TE bundle installed: ``bash bench/te_session.sh``; skipped where TE does not import).

* TE FP8 resumes bitwise in deterministic mode, with current and with delayed scaling: 8 steps in
  one run against 4 + resume + 4 from a copy of the step-4 checkpoint. With delayed scaling the FP8
  scaling state (amax history and scales, TE's ``_extra_state``) must be part of the checkpoint: a
  resume that lost it would start from fresh scales and its losses would differ from step 5 on.
* SIGTERM in the middle of a TE FP8 run (a subprocess) saves and exits with the preemption code;
  the same command relaunched resumes from that checkpoint and finishes.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import torch

from training import checkpoint as ckpt
from training.signals import EXIT_DONE, EXIT_PREEMPTED

from .conftest import metrics
from .test_preemption import child_env, signal_a_run_at_step_3
from .test_train_gpu import GPU_MODEL, check_resume_is_exact

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def transformer_engine():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from llama.specs import have_transformer_engine

    if not have_transformer_engine():
        pytest.skip(
            "Transformer Engine does not import here (pip install -e '.[te]', or bench/te_session.sh)"
        )


def te_fp8(scaling: str) -> tuple[str, ...]:
    return (
        *GPU_MODEL,
        "model.transformer_impl=transformer_engine",
        "projection.precision=te_fp8",
        f"projection.fp8_scaling={scaling}",
    )


@pytest.mark.parametrize("scaling", ["current", "delayed"])
def test_te_fp8_resume_is_exact_in_deterministic_mode(make_cfg, train, tmp_path, scaling):
    text = check_resume_is_exact(
        make_cfg, train, tmp_path, (*te_fp8(scaling), "runtime.deterministic=true"), scaling
    )
    assert "te_fp8" in text, text  # the plan's projection line


def test_te_fp8_sigterm_saves_and_the_relaunch_finishes(tiny_corpus, tmp_path):
    code, out, _, cmd = signal_a_run_at_step_3(
        tiny_corpus, tmp_path, signal.SIGTERM, overrides=te_fp8("delayed"), train_iters=60, timeout=300
    )
    assert code == EXIT_PREEMPTED, out
    recs = metrics(tmp_path / "run")
    last = max(r["step"] for r in recs if r["kind"] == "train")
    assert 3 <= last < 60
    root = tmp_path / "run" / "checkpoints"
    assert (root / ckpt.MARKER).read_text().strip() == str(last)
    assert ckpt.verify_checkpoint(ckpt.iter_dir(root, last)) is None

    res = subprocess.run(
        cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600, check=False
    )
    assert res.returncode == EXIT_DONE, res.stdout + res.stderr
    recs = metrics(tmp_path / "run")
    events = [(r["event"], r["step"]) for r in recs if r["kind"] == "event"]
    assert ("resume", last) in events
    steps = [r["step"] for r in recs if r["kind"] == "train"]
    assert steps[-1] == 60 and steps.count(last + 1) == 1
