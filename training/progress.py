"""Progress of one launch of the training loop: elapsed time and ETA, throughput units, the run summary.

The per-step line (:meth:`training.metrics.MetricsLogger.train`) ends with ``elapsed h:mm:ss | ETA
h:mm:ss``, also when the output is a file (Slurm logs), where no progress bar is drawn:

* elapsed: wall time since the launch started (set-up included);
* ETA: the mean wall time per step of this launch times the steps left. The mean runs from the end
  of the launch's first step to the end of the latest one, so the first step (compilation and
  warm-up, several times a later step on a GPU) is left out and the validation and checkpoint
  time between steps is counted in. After the first step of a launch there is no estimate (``-``).

Throughput: on a GPU ``tok/s/GPU``; on a CPU ``tok/s``, the job's tokens per second (the
``tokens_per_s_per_gpu`` of ``metrics.jsonl`` is per process there, times the process count).

At the end of a launch, whether it finished, was stopped by a signal or the time budget, or
stopped on a non-finite loss, :func:`summary_lines` gives the run summary: status (and how the run
resumes), wall time, steps and tokens, last and mean training loss, last validation loss, mean
throughput (and MFU on a GPU), and where the metrics, checkpoints, TensorBoard and wandb files are.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .signals import EXIT_DONE, EXIT_NONFINITE, EXIT_OUT_OF_MEMORY, EXIT_PREEMPTED, EXIT_TIME_BUDGET

__all__ = ["LaunchProgress", "Outputs", "format_hms", "summary_lines", "throughput_text"]

LAST_N_LOSSES = 10  # the summary's mean training loss is over the last this many finite steps


def format_hms(seconds: float) -> str:
    """``h:mm:ss`` of a duration in seconds (hours not wrapped at 24: ``52:54:10``); ``-`` for None
    or a non-finite or negative value."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def throughput_text(tokens_per_s_per_gpu: float, *, on_gpu: bool, world_size: int, unit: str = "tok") -> str:
    """``12,345 tok/s/GPU`` on a GPU; on a CPU the job's total ``12,345 tok/s`` (per-process rate
    times ``world_size``): there is no GPU to divide by."""
    if on_gpu:
        return f"{tokens_per_s_per_gpu:,.0f} {unit}/s/GPU"
    return f"{tokens_per_s_per_gpu * world_size:,.0f} {unit}/s"


@dataclass
class LaunchProgress:
    """What one launch has trained so far, fed with every train and validation record.

    Args:
        start_step: the iteration the launch starts from (0 fresh, N after resuming from step N).
        start_tokens: consumed tokens at ``start_step``.
        total_steps: the run's ``train_iters``.
        on_gpu: a CUDA run (units tokens/s/GPU and MFU) or a CPU run (tokens/s, no MFU).
        world_size: processes (GPUs on a GPU run).
        mfu_per_token_rate: ``flops_per_token / peak FLOP/s per GPU`` (MFU = tokens/s/GPU times this),
            None on a CPU.
        t_launch: ``clock()`` when the launch started.
        clock: seconds, monotonic (``time.perf_counter``; a fake in tests).
    """

    start_step: int
    start_tokens: int
    total_steps: int
    on_gpu: bool
    world_size: int
    mfu_per_token_rate: float | None = None
    clock: Callable[[], float] = time.perf_counter
    t_launch: float | None = None
    # accumulated by step() / valid()
    steps: int = 0
    last_step: int | None = None
    last_tokens: int | None = None
    last_loss: float | None = None
    nonfinite_count: int = 0
    loss_sum: float = 0.0
    loss_n: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=LAST_N_LOSSES))  # (step, finite loss)
    timed_tokens: int = 0  # tokens and step time of the steps after the launch's first
    timed_seconds: float = 0.0
    last_valid: tuple[int, float] | None = None
    _t_first_end: float | None = None
    _t_last_end: float | None = None

    def __post_init__(self):
        if self.t_launch is None:
            self.t_launch = self.clock()

    def step(self, rec: dict) -> None:
        """Account for one train record of ``metrics.jsonl`` (``step``, ``consumed_tokens``, ``loss``,
        ``step_time_s``, ``nonfinite_count``), just after the step ended."""
        now = self.clock()
        prev_tokens = self.start_tokens if self.last_tokens is None else self.last_tokens
        if self.steps == 0:
            self._t_first_end = now
        else:
            self.timed_tokens += rec["consumed_tokens"] - prev_tokens
            self.timed_seconds += rec["step_time_s"]
        self._t_last_end = now
        self.steps += 1
        self.last_step = rec["step"]
        self.last_tokens = rec["consumed_tokens"]
        self.last_loss = rec["loss"]
        self.nonfinite_count = rec["nonfinite_count"]
        if math.isfinite(rec["loss"]):
            self.loss_sum += rec["loss"]
            self.loss_n += 1
            self.recent.append((rec["step"], rec["loss"]))

    def valid(self, step: int, val_loss: float) -> None:
        self.last_valid = (step, val_loss)

    def elapsed(self) -> float:
        """Seconds since the launch started."""
        return self.clock() - self.t_launch

    def eta(self) -> float | None:
        """Seconds until ``total_steps``: the mean wall time per step after the launch's first step
        times the steps left; 0 when done; None before the second step of the launch."""
        if self.last_step is None:
            return None
        left = self.total_steps - self.last_step
        if left <= 0:
            return 0.0
        if self.steps < 2:
            return None
        return (self._t_last_end - self._t_first_end) / (self.steps - 1) * left

    def tail(self) -> str:
        """The end of the per-step line: ``elapsed 0:01:02 | ETA 0:10:00``."""
        return f"elapsed {format_hms(self.elapsed())} | ETA {format_hms(self.eta())}"

    def mean_tokens_per_s_per_gpu(self) -> float | None:
        """Tokens per second per GPU (per process on a CPU) over the steps after the launch's first
        (step time only: validation and saves are not in it); None before the launch's second step."""
        if self.timed_seconds > 0:
            return self.timed_tokens / self.timed_seconds / self.world_size
        return None

    def throughput(self, tokens_per_s_per_gpu: float, unit: str = "tok") -> str:
        return throughput_text(
            tokens_per_s_per_gpu, on_gpu=self.on_gpu, world_size=self.world_size, unit=unit
        )


@dataclass(frozen=True)
class Outputs:
    """Where a run's files are, for the summary: ``metrics`` (metrics.jsonl), ``checkpoints`` (the
    checkpoint root, None with checkpoint.save=false), ``newest_checkpoint`` (None: none complete),
    ``tensorboard`` (the event-file directory, or why there is none), ``wandb`` (a line, None when
    off)."""

    metrics: Path
    checkpoints: Path | None
    newest_checkpoint: Path | None
    tensorboard: Path | str
    wandb: str | None


def _status(code: int, progress: LaunchProgress, detail: str, outputs: Outputs) -> str:
    step, total = progress.last_step, progress.total_steps
    newest = outputs.newest_checkpoint
    if code == EXIT_DONE:
        return f"done: {step} of {total} steps"
    if code in (EXIT_PREEMPTED, EXIT_TIME_BUDGET):
        what = f"stopped at step {step} of {total} ({detail})"
        if outputs.checkpoints is None:
            return f"{what}; nothing saved (checkpoint.save=false): a relaunch starts from step 0"
        if newest is None:
            return f"{what}; no complete checkpoint: a relaunch starts from step 0"
        return f"{what}; it will resume: the same command relaunched continues from {newest}"
    # where a relaunch starts after a stop that saved nothing (out of memory, non-finite stop)
    where = f"continues from {newest}" if newest is not None else "starts from step 0"
    if code == EXIT_OUT_OF_MEMORY:
        return (
            f"stopped after step {step} of {total}: out of GPU memory, nothing saved; relaunched with the "
            f"change the exit event names, the job {where}"
        )
    if code == EXIT_NONFINITE:
        return (
            f"stopped at step {step} of {total}: non-finite loss or gradients (runtime.nonfinite=stop), "
            f"nothing saved; a relaunch {where}"
        )
    return f"exit code {code} at step {step} of {total} ({detail})"


def summary_lines(progress: LaunchProgress, *, code: int, detail: str, outputs: Outputs) -> list[str]:
    """The run summary of a launch that ran at least one step, as aligned text lines.

    Args:
        progress: the launch's progress.
        code: the exit code (training.signals).
        detail: the exit event's detail (the reason of a stop).
        outputs: where the files are.
    """
    p = progress
    first = p.start_step + 1
    rows = [
        ("status", _status(code, p, detail, outputs)),
        ("wall time", f"{format_hms(p.elapsed())} (this launch, set-up included)"),
        (
            "steps",
            f"{p.steps:,} this launch (steps {first:,}-{p.last_step:,}); {p.last_step:,} of "
            f"{p.total_steps:,} done",
        ),
        ("tokens", f"{p.last_tokens - p.start_tokens:,} this launch; {p.last_tokens:,} in all"),
    ]
    loss = f"{p.last_loss:.4f} at step {p.last_step:,}"
    if p.recent:
        a, b = p.recent[0][0], p.recent[-1][0]
        mean_recent = sum(v for _, v in p.recent) / len(p.recent)
        loss += (
            f"; mean {mean_recent:.4f} over the last {len(p.recent)} finite step(s) ({a:,}-{b:,}), "
            f"{p.loss_sum / p.loss_n:.4f} over all {p.loss_n:,} of this launch"
        )
    rows.append(("train loss", loss))
    if p.last_valid is not None:
        rows.append(("valid loss", f"{p.last_valid[1]:.4f} at step {p.last_valid[0]:,}"))
    else:
        rows.append(("valid loss", "none (validation.interval / validation.iters = 0, or not reached)"))
    tps = p.mean_tokens_per_s_per_gpu()
    if tps is None:
        rows.append(("throughput", "- (one step this launch: its time includes start-up)"))
    else:
        text = f"{p.throughput(tps, 'tokens')} (mean of steps {first + 1:,}-{p.last_step:,}, step time only)"
        if p.on_gpu and p.mfu_per_token_rate is not None:
            text += f", MFU {100 * tps * p.mfu_per_token_rate:.1f}%"
        rows.append(("throughput", text))
    rows.append(("non-finite", f"{p.nonfinite_count} step(s) skipped in all"))
    rows.append(("metrics", f"{outputs.metrics} (run_meta.json beside it)"))
    if outputs.checkpoints is None:
        rows.append(("checkpoints", "none (checkpoint.save=false)"))
    else:
        newest = outputs.newest_checkpoint.name if outputs.newest_checkpoint is not None else "none complete"
        rows.append(("checkpoints", f"{outputs.checkpoints} (newest: {newest})"))
    if isinstance(outputs.tensorboard, Path):
        rows.append(("TensorBoard", f"{outputs.tensorboard} (tensorboard --logdir {outputs.tensorboard})"))
    else:
        rows.append(("TensorBoard", outputs.tensorboard))
    rows.append(("wandb", outputs.wandb or "off (logging.wandb_mode=disabled)"))
    width = max(len(k) for k, _ in rows)
    return ["run summary:"] + [f"  {k:<{width}}  {v}" for k, v in rows]
