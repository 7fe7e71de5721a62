"""Run-directory outputs: ``metrics.jsonl``, ``run_meta.json``, terminal lines, TensorBoard, wandb.

Terminal lines: one per ``logging.log_interval`` steps (loss, grad norm, LR, step time, throughput,
MFU and memory, elapsed and ETA), one per validation, one per event, and the run summary at the end
of a launch (see :mod:`training.progress`).

``metrics.jsonl`` holds one JSON object per line, with a ``kind``:

* ``train``: ``step`` (1-based, the step just finished), ``consumed_samples``, ``consumed_tokens``,
  ``loss``, ``grad_norm`` (float or null), ``lr``, ``step_time_s``, ``tokens_per_s_per_gpu`` (per
  process on a CPU), ``mfu`` (float or null: null on CPU), ``peak_mem_gib`` (CUDA max allocated on
  a GPU, the process's max RSS on a CPU), ``skipped`` (the update was not applied: non-finite loss
  or gradients), ``nonfinite_count`` (cumulative);
* ``valid``: ``step``, ``consumed_tokens``, ``val_loss``;
* ``telemetry``: ``step``, ``layer`` (1-based), ``max_logit``, ``zero_scale_block_frac`` (null for
  recipes without NVFP4 Q/K);
* ``event``: ``step``, ``event`` (``start``, ``resume``, ``save``, ``exit``), ``detail``.

Numbers are written with Python's ``json`` (a non-finite ``loss`` of a skipped step is written as
``NaN``/``Infinity``, which Python's and pandas' readers accept; ``grad_norm`` is null when not
finite). The file is only ever appended to. After a kill and resume, steps between the resumed
checkpoint and the kill appear twice: the ``resume`` event marks where the second run starts, and
**readers keep, for each (kind, step[, layer]), the LAST record in the file** - that is the record of
the run whose state the training continued from - and drop the records of the steps after a
``resume`` event's step (a fresh ``start``: all of them) read before it (:mod:`training.records`).
A ``resume`` event's ``allowed_changes`` lists the config changes allowed at it
(``[key, value in the checkpoint, value now]``).

``run_meta.json`` (rewritten at every start) holds ``config_fingerprint``, ``data_order_fingerprint``,
``precision``, ``data_content``, ``layer_spec``, ``seed``, ``world_size``, ``commit`` and the resolved
``config``; see :func:`run_meta`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from .progress import LaunchProgress, Outputs, summary_lines
from .records import relaunch_step
from .resolved import canonical_json, config_fingerprint

__all__ = ["MetricsLogger", "data_order_fingerprint", "git_commit", "read_metrics", "run_meta"]


def git_commit() -> str | None:
    """Short hash of the repository's HEAD, or None outside a git checkout. ``$BENCH_COMMIT``, when set,
    wins: for copies of a working tree whose git metadata is not the tree's (the GPU machine's copy
    reported the session's first commit for every run on 2026-11-29)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def data_order_fingerprint(
    *, dataset_identity: str, data_seed: int, seq_length: int, global_batch_size: int, micro_batch_size: int
) -> str:
    obj = {
        "dataset_identity": dataset_identity,
        "data_seed": data_seed,
        "seq_length": seq_length,
        "global_batch_size": global_batch_size,
        "micro_batch_size": micro_batch_size,
    }
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def run_meta(
    *,
    resolved: dict,
    dataset_identity: str,
    world_size: int,
    data_content: str | None = None,
    layer_spec: str | None = None,
) -> dict:
    """``run_meta.json``: the fingerprints ``tools/compare_runs.py`` compares, the precision arm,
    ``data_content`` (:func:`data.loader.content_key` of the prepared files; megatron-core's
    ``dataset_identity`` in the data-order fingerprint names their paths, not what they hold) and
    ``layer_spec`` (``transformer_engine`` or ``local``: what ``model.transformer_impl=auto`` built
    on the machine). Those two are fields of their own, not parts of a fingerprint, so that runs
    recorded before them (2026-12-06) still compare with the runs after them."""
    data, training = resolved["data"], resolved["training"]
    return {
        "config_fingerprint": config_fingerprint(resolved),
        "data_order_fingerprint": data_order_fingerprint(
            dataset_identity=dataset_identity,
            data_seed=data["seed"],
            seq_length=data["seq_length"],
            global_batch_size=training["global_batch_size"],
            micro_batch_size=training["micro_batch_size"],
        ),
        "precision": {
            "attention_recipe": resolved["attention"]["recipe"],
            "attention_backend": resolved["attention"]["backend"],
            "projection": resolved["projection"],
        },
        "data_content": data_content,
        "layer_spec": layer_spec,
        "seed": training["seed"],
        "world_size": world_size,
        "commit": git_commit(),
        "config": resolved,
    }


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics file, keeping for each (kind, step, layer) the last one, in step order.

    A ``resume`` event at step k drops the records of steps after k read before it, and a fresh
    ``start`` event all of them (:func:`training.records.relaunch_step`): the relaunch trains those
    steps again, and after a rollback or a fresh start in the same directory they belong to the run
    abandoned."""
    last: dict = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                if rec["kind"] == "event":
                    if (at := relaunch_step(rec)) is not None:
                        last = {key: r for key, r in last.items() if key[1] <= at}
                    continue
                last[(rec["kind"], rec["step"], rec.get("layer"))] = rec
    return sorted(last.values(), key=lambda r: (r["step"], r["kind"], r.get("layer") or 0))


class MetricsLogger:
    """Writes metrics on the logging rank (``enabled``); every method is a no-op elsewhere."""

    def __init__(self, output_dir: Path, *, cfg, enabled: bool, log=print):
        self.enabled = enabled
        self.log = log
        self.cfg = cfg
        self._file = None
        self._tb = None  # the SummaryWriter, made by _scalar_sink() at the first scalar
        self._tb_writer = None  # what makes it (logging.tensorboard and the package installed)
        self._tb_dir: Path | str = "off (logging.tensorboard=false)"  # the directory, or why there is none
        self._wandb = None
        # (records, first step, last step) of the training records already in the metrics file (an
        # earlier launch's), None if it holds none
        self.earlier_train_steps: tuple[int, int, int] | None = None
        self._bar = None
        self._t_launch = time.perf_counter()  # the launch's clock: elapsed, ETA and the summary's wall time
        self.progress: LaunchProgress | None = None  # set by start_progress()
        if not enabled:
            return
        output_dir.mkdir(parents=True, exist_ok=True)
        self.path = output_dir / cfg.logging.metrics_file
        self.earlier_train_steps = _train_steps(self.path)
        torn = _drop_torn_last_line(self.path)
        if torn:
            log(
                f"metrics: WARNING: the last line of {self.path} was cut mid-write by an earlier launch "
                f"({torn!r}); removed, so that this launch's first record starts a line of its own"
            )
        self._file = open(self.path, "a", buffering=1)
        if cfg.logging.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb_dir = output_dir / "tensorboard"
                # made at the first scalar: a launch refused at start-up leaves no empty event file
                # (found in review, 2026-12-06: 8 refusals, 8 more files)
                self._tb_writer = lambda: SummaryWriter(log_dir=str(self._tb_dir))
                log(f"logging: TensorBoard -> {self._tb_dir}")
            except ImportError:
                self._tb_dir = "off: the 'tensorboard' package is not installed (bash scripts/bootstrap.sh)"
                log("logging: TensorBoard skipped (the 'tensorboard' package is not installed)")
        if cfg.logging.wandb_mode != "disabled":  # installed: the trainer checked (exit code 2 if not)
            import wandb

            self._wandb = wandb.init(
                project=cfg.logging.wandb_project,
                mode=cfg.logging.wandb_mode,
                dir=str(output_dir),
                config=None,
                resume="allow",
            )
            log(f"logging: wandb {cfg.logging.wandb_mode}, project {cfg.logging.wandb_project}")

    def write_meta(self, meta: dict) -> None:
        if not self.enabled:
            return
        path = self.path.parent / "run_meta.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(tmp, path)

    def record(self, rec: dict) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(rec) + "\n")
        step = rec.get("step", 0)
        if rec["kind"] in ("train", "valid"):
            scalars = {
                k: v
                for k, v in rec.items()
                if isinstance(v, (int, float))
                and not isinstance(v, bool)
                and k != "step"
                and v is not None
                and math.isfinite(v)
            }
            if (tb := self._scalar_sink()) is not None:
                for k, v in scalars.items():
                    tb.add_scalar(f"{rec['kind']}/{k}", v, step)
            if self._wandb is not None:
                self._wandb.log({f"{rec['kind']}/{k}": v for k, v in scalars.items()}, step=step)
        elif rec["kind"] == "telemetry" and (tb := self._scalar_sink()) is not None:
            tb.add_scalar(f"telemetry/max_logit/layer{rec['layer']}", rec["max_logit"], step)
            if rec["zero_scale_block_frac"] is not None:
                tb.add_scalar(
                    f"telemetry/zero_scale_block_frac/layer{rec['layer']}", rec["zero_scale_block_frac"], step
                )

    def _scalar_sink(self):
        """The TensorBoard writer, made on first use; None without TensorBoard."""
        if self._tb is None and self._tb_writer is not None:
            self._tb = self._tb_writer()
        return self._tb

    def event(self, step: int, event: str, detail: str, **fields) -> None:
        """An ``event`` record (``fields``: more JSON fields of it) and its terminal line."""
        self.record({"kind": "event", "step": step, "event": event, "detail": detail, **fields})
        self.info(f"[{event}] step {step}: {detail}")

    def train(self, **fields) -> None:
        rec = {"kind": "train", **fields}
        rec["grad_norm"] = _clean(rec["grad_norm"])
        self.record(rec)
        if not self.enabled:
            return
        if self.progress is not None:
            self.progress.step(rec)
        step = rec["step"]
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix(loss=f"{rec['loss']:.4f}", refresh=False)
        if step % self.cfg.logging.log_interval == 0 or rec["skipped"] or step == self.cfg.train_iters:
            self.info(self.step_line(rec))

    def step_line(self, rec: dict) -> str:
        """The per-step line of a train record: loss, grad norm, LR, step time, throughput (tok/s/GPU
        on a GPU, tok/s on a CPU), MFU and peak memory where measured, elapsed time and ETA
        (:mod:`training.progress`)."""
        gn = "-" if rec["grad_norm"] is None else f"{rec['grad_norm']:.3f}"
        p = self.progress
        if p is not None:
            rate = p.throughput(rec["tokens_per_s_per_gpu"])
        else:
            rate = f"{rec['tokens_per_s_per_gpu']:,.0f} tok/s/GPU"
        parts = [
            f"step {rec['step']:>6}/{self.cfg.train_iters}",
            f"loss {rec['loss']:.4f}",
            f"grad norm {gn}",
            f"lr {rec['lr']:.3e}",
            f"{rec['step_time_s']:.3f} s",
            rate,
        ]
        if rec["mfu"] is not None:
            parts.append(f"MFU {100 * rec['mfu']:.2f}%")
        if rec["peak_mem_gib"] is not None:
            parts.append(f"mem {rec['peak_mem_gib']:.1f} GiB")
        if p is not None:
            parts.append(p.tail())
        if rec["skipped"]:
            parts.append(f"SKIPPED (non-finite, total {rec['nonfinite_count']})")
        return " | ".join(parts)

    def valid(self, step: int, consumed_tokens: int, val_loss: float) -> None:
        self.record({"kind": "valid", "step": step, "consumed_tokens": consumed_tokens, "val_loss": val_loss})
        if self.progress is not None:
            self.progress.valid(step, val_loss)
        self.info(f"step {step:>6}/{self.cfg.train_iters} | validation loss {val_loss:.4f}")

    def exit(
        self,
        step: int,
        code: int,
        detail: str,
        *,
        checkpoints: Path | None,
        newest_checkpoint: Path | None,
    ) -> None:
        """Record the ``exit`` event and, when this launch trained at least one step, print the run
        summary (:func:`training.progress.summary_lines`).

        Args:
            code: the exit code (training.signals); detail: the event's text.
            checkpoints: the checkpoint root (None with checkpoint.save=false).
            newest_checkpoint: the newest complete checkpoint now (None: none).
        """
        self.event(step, "exit", detail)
        if not self.enabled or self.progress is None or not self.progress.steps:
            return
        wandb = None
        if self._wandb is not None:
            where = getattr(self._wandb, "url", None) or getattr(self._wandb, "dir", None)
            wandb = f"{self.cfg.logging.wandb_mode}, project {self.cfg.logging.wandb_project}" + (
                f" ({where})" if where else ""
            )
        outputs = Outputs(
            metrics=self.path,
            checkpoints=checkpoints,
            newest_checkpoint=newest_checkpoint,
            tensorboard=self._tb_dir,
            wandb=wandb,
        )
        for line in summary_lines(self.progress, code=code, detail=detail, outputs=outputs):
            self.info(line)

    def start_progress(
        self,
        start_step: int,
        *,
        start_tokens: int = 0,
        on_gpu: bool = False,
        world_size: int = 1,
        flops_per_token: float | None = None,
    ) -> None:
        """Start this launch's progress (elapsed/ETA, the summary) at ``start_step`` /
        ``start_tokens``, and the progress bar when stderr is a terminal (``logging.progress_bar``).
        ``on_gpu``: units tokens/s/GPU and MFU (from ``flops_per_token``), else tokens/s."""
        if not self.enabled:
            return
        self.progress = LaunchProgress(
            start_step=start_step,
            start_tokens=start_tokens,
            total_steps=self.cfg.train_iters,
            on_gpu=on_gpu,
            world_size=world_size,
            mfu_per_token_rate=(
                flops_per_token / self.cfg.logging.peak_flops_per_gpu if on_gpu and flops_per_token else None
            ),
            t_launch=self._t_launch,
        )
        if not (self.cfg.logging.progress_bar and sys.stderr.isatty()):
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(
            total=self.cfg.train_iters, initial=start_step, desc="train", unit="step", dynamic_ncols=True
        )

    def info(self, msg: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(msg)
        else:
            self.log(msg)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._file is not None:
            self._file.close()
            self._file = None


def _drop_torn_last_line(path: Path) -> str:
    """Truncate ``path`` after its last newline when it does not end in one (a launch killed in the
    middle of a write); returns the removed text (at most its first 80 characters), "" if none.

    Found in review (2026-12-06): appending after the fragment glued the next launch's first record
    (its resume event) to it, one line no reader could parse, and the readers that skip such lines
    lost the resume event."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return ""
    if size == 0:
        return ""
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return ""
        step, pos = 1 << 16, size
        while pos > 0:  # find the last newline, reading back from the end
            start = max(0, pos - step)
            f.seek(start)
            chunk = f.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        else:
            keep = 0
        f.seek(keep)
        torn = f.read(size - keep)
        f.truncate(keep)
    return torn.decode(errors="replace")[:80]


def _train_steps(path: Path) -> tuple[int, int, int] | None:
    """(records, first step, last step) of the ``"kind": "train"`` records of metrics file ``path``,
    None when it does not exist or holds none (lines that are not JSON are skipped)."""
    if not path.is_file():
        return None
    steps = []
    with open(path) as f:
        for line in f:
            if '"train"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("kind") == "train" and isinstance(rec.get("step"), int):
                steps.append(rec["step"])
    return (len(steps), min(steps), max(steps)) if steps else None
