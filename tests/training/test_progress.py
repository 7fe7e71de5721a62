"""Elapsed time, ETA, throughput units and the run summary (training.progress), and the per-step line."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.config import load_config
from training.metrics import MetricsLogger
from training.progress import LaunchProgress, Outputs, format_hms, summary_lines, throughput_text
from training.signals import EXIT_DONE, EXIT_NONFINITE, EXIT_PREEMPTED, EXIT_TIME_BUDGET


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def rec(step, *, tokens_per_step=1000, loss=3.0, step_time=1.0, nonfinite=0, tps=1000.0, mfu=None, mem=None):
    return {
        "kind": "train",
        "step": step,
        "consumed_tokens": step * tokens_per_step,
        "loss": loss,
        "grad_norm": 0.5,
        "lr": 1e-3,
        "step_time_s": step_time,
        "tokens_per_s_per_gpu": tps,
        "mfu": mfu,
        "peak_mem_gib": mem,
        "skipped": False,
        "nonfinite_count": nonfinite,
    }


def test_format_hms():
    assert format_hms(0) == "0:00:00"
    assert format_hms(61.4) == "0:01:01"
    assert format_hms(3 * 3600 + 25 * 60 + 7) == "3:25:07"
    assert format_hms(52 * 3600 + 54 * 60 + 10) == "52:54:10"  # not wrapped at a day
    assert format_hms(None) == format_hms(float("nan")) == format_hms(-1) == "-"


def test_throughput_units_per_gpu_on_gpu_total_on_cpu():
    assert throughput_text(12345.4, on_gpu=True, world_size=8) == "12,345 tok/s/GPU"
    assert throughput_text(100.0, on_gpu=False, world_size=1) == "100 tok/s"
    assert throughput_text(100.0, on_gpu=False, world_size=2) == "200 tok/s"  # per process x processes
    assert throughput_text(5.0, on_gpu=False, world_size=1, unit="tokens") == "5 tokens/s"


def test_eta_leaves_out_the_first_step_and_counts_time_between_steps():
    clock = Clock()
    p = LaunchProgress(start_step=0, start_tokens=0, total_steps=10, on_gpu=True, world_size=1, clock=clock)
    clock.t += 30.0  # set-up
    assert p.eta() is None and p.tail() == "elapsed 0:00:30 | ETA -"
    clock.t += 20.0  # the first step: compilation
    p.step(rec(1, step_time=20.0))
    assert p.eta() is None  # one step: no estimate
    for s in (2, 3):
        clock.t += 2.0  # 1.5 s of step and 0.5 s of validation / saving between steps
        p.step(rec(s, step_time=1.5))
    assert p.eta() == pytest.approx(2.0 * 7)  # mean 2 s per step after the first, 7 steps left
    assert p.tail() == "elapsed 0:00:54 | ETA 0:00:14"
    assert p.mean_tokens_per_s_per_gpu() == pytest.approx(2000 / 3.0)  # steps 2-3, step time only


def test_eta_of_a_resumed_launch_and_at_the_end():
    clock = Clock()
    p = LaunchProgress(
        start_step=40, start_tokens=40_000, total_steps=42, on_gpu=False, world_size=1, clock=clock
    )
    for s in (41, 42):
        clock.t += 5.0
        p.step(rec(s))
    assert p.eta() == 0.0 and p.steps == 2 and p.last_tokens - p.start_tokens == 2000


def _outputs(tmp: Path, *, newest=True, save=True, tb=True):
    root = tmp / "checkpoints"
    return Outputs(
        metrics=tmp / "metrics.jsonl",
        checkpoints=root if save else None,
        newest_checkpoint=root / "iter_0000003" if newest and save else None,
        tensorboard=tmp / "tensorboard" if tb else "off (logging.tensorboard=false)",
        wandb=None,
    )


def _progress(*, on_gpu, steps=3, losses=(11.0, 9.0, 7.0), mfu_rate=None):
    clock = Clock()
    p = LaunchProgress(
        start_step=0,
        start_tokens=0,
        total_steps=10,
        on_gpu=on_gpu,
        world_size=2,
        mfu_per_token_rate=mfu_rate,
        clock=clock,
    )
    for s in range(1, steps + 1):
        clock.t += 10.0
        p.step(rec(s, loss=losses[s - 1], step_time=0.5))
    p.valid(3, 7.5)
    return p


def test_summary_of_a_finished_cpu_run(tmp_path):
    p = _progress(on_gpu=False)
    text = "\n".join(summary_lines(p, code=EXIT_DONE, detail="done", outputs=_outputs(tmp_path)))
    assert "status       done: 3 of 10 steps" in text
    assert "wall time    0:00:30" in text
    assert "3 this launch (steps 1-3); 3 of 10 done" in text and "3,000 this launch; 3,000 in all" in text
    assert "7.0000 at step 3; mean 9.0000 over the last 3 finite step(s) (1-3)" in text
    assert "valid loss   7.5000 at step 3" in text
    # 2 processes: 1000 tokens / 0.5 s / 2 per process, times 2 processes = 2000 tokens/s of the job
    assert "2,000 tokens/s (mean of steps 2-3, step time only)" in text
    assert "/GPU" not in text and "MFU" not in text
    assert f"{tmp_path / 'metrics.jsonl'}" in text and "(newest: iter_0000003)" in text
    assert f"tensorboard --logdir {tmp_path / 'tensorboard'}" in text
    assert "wandb        off (logging.wandb_mode=disabled)" in text


def test_summary_of_a_gpu_run_has_mfu(tmp_path):
    p = _progress(on_gpu=True, mfu_rate=1e-4)
    text = "\n".join(summary_lines(p, code=EXIT_DONE, detail="done", outputs=_outputs(tmp_path, tb=False)))
    assert "1,000 tokens/s/GPU (mean of steps 2-3, step time only), MFU 10.0%" in text
    assert "TensorBoard  off (logging.tensorboard=false)" in text


@pytest.mark.parametrize(
    "code, kw, want",
    [
        (EXIT_PREEMPTED, {}, "stopped at step 3 of 10 (preempted (SIGTERM)); it will resume: the same "),
        (EXIT_TIME_BUDGET, {}, "it will resume: the same command relaunched continues from "),
        (
            EXIT_PREEMPTED,
            {"save": False},
            "nothing saved (checkpoint.save=false): a relaunch starts from step 0",
        ),
        (EXIT_PREEMPTED, {"newest": False}, "no complete checkpoint: a relaunch starts from step 0"),
        (
            EXIT_NONFINITE,
            {},
            "non-finite loss or gradients (runtime.nonfinite=stop), nothing saved; a relaunch",
        ),
    ],
)
def test_summary_says_how_a_stopped_run_resumes(tmp_path, code, kw, want):
    p = _progress(on_gpu=False)
    lines = summary_lines(p, code=code, detail="preempted (SIGTERM)", outputs=_outputs(tmp_path, **kw))
    assert want in lines[1], lines[1]


def test_summary_of_a_one_step_launch_and_nonfinite_losses(tmp_path):
    p = _progress(on_gpu=False, steps=1, losses=(float("nan"),))
    text = "\n".join(summary_lines(p, code=EXIT_DONE, detail="done", outputs=_outputs(tmp_path)))
    assert "throughput   - (one step this launch" in text
    assert "nan at step 1" in text and "mean" not in text.split("train loss")[1].splitlines()[0]


def _logger(tmp_path, *, on_gpu):
    cfg = load_config(None, [f"runtime.output_dir={tmp_path}", "logging.tensorboard=false"])
    lines = []
    m = MetricsLogger(tmp_path, cfg=cfg, enabled=True, log=lines.append)
    m.start_progress(0, on_gpu=on_gpu, world_size=1, flops_per_token=1e9)
    return m, lines


def test_step_line_units_elapsed_and_eta(tmp_path):
    m, lines = _logger(tmp_path, on_gpu=False)
    m.train(**{k: v for k, v in rec(1, mem=1.6).items() if k != "kind"})
    m.train(**{k: v for k, v in rec(2, mem=1.6).items() if k != "kind"})
    line = lines[-1]
    assert "| 1,000 tok/s |" in line and "/GPU" not in line and "MFU" not in line
    assert "mem 1.6 GiB" in line and "| elapsed 0:00:00 | ETA 0:00:" in line
    m.close()
    g, lines = _logger(tmp_path / "g", on_gpu=True)
    g.train(**{k: v for k, v in rec(1, mfu=0.4, mem=80.0).items() if k != "kind"})
    assert "| 1,000 tok/s/GPU | MFU 40.00% | mem 80.0 GiB | elapsed " in lines[-1]
    assert lines[-1].endswith("ETA -")
    g.close()


def test_default_config_writes_tensorboard_scalars(tmp_path):
    """logging.tensorboard is on by default and the package is a dependency: the scalars arrive."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(None, [f"runtime.output_dir={tmp_path}"])
    assert cfg.logging.tensorboard
    lines = []
    m = MetricsLogger(tmp_path, cfg=cfg, enabled=True, log=lines.append)
    m.start_progress(0)
    for s in (1, 2):
        m.train(**{k: v for k, v in rec(s, loss=4.0 - s).items() if k != "kind"})
    m.close()
    assert f"logging: TensorBoard -> {tmp_path / 'tensorboard'}" in lines
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 3.0), (2, 2.0)]
    # a launch that writes no scalar (refused at start-up) leaves no event file (found in review,
    # 2026-12-06: every refused launch added an empty one)
    other = tmp_path / "refused"
    m = MetricsLogger(other, cfg=cfg, enabled=True, log=lines.append)
    m.event(0, "exit", "refused")
    m.close()
    assert not (other / "tensorboard").exists()
