"""The training loop, shared by both engines: data, schedule, logging, validation, checkpoints, signals.

    code = Trainer(load_config("configs/default.yaml")).run()     # an exit code, see training.signals

One step = ``accumulation`` micro-batches per data-parallel rank (``global_batch_size`` samples in
all), the LR of :func:`training.schedule.lr_at` for that step, one optimizer update (or none, if the
loss or gradients are not finite). After every step the loop logs, samples attention telemetry,
validates, saves, and checks the stop flags (signal, time budget) all-reduced over ranks. When the
launch ends (done, a signal, the time budget, a non-finite stop) rank 0 prints the run summary
(:mod:`training.progress`: wall time, steps, tokens, losses, throughput, where the files are).

Resume (``checkpoint.load: auto``): the newest complete checkpoint under ``checkpoint.dir`` is
checked against the new config (:func:`training.checkpoint.check_resume_compatible`), then the
engine state (model, optimizer, RNG) and the trainer state (:class:`training.state.TrainerState`:
iteration, consumed samples and tokens, non-finite count) are restored; the data loader restarts
at ``consumed_samples`` of the identically rebuilt dataset, so the resumed run sees exactly the
batches the uninterrupted run would have seen. Every file's checksum is verified first (each rank
a share); a checkpoint that is incomplete, fails its checksums or does not deserialize is skipped
with a warning naming the file, for the previous complete one; when every ``iter_*`` directory is
unusable the job stops (exit code 2) rather than start over next to them.

Start-up: ``runtime.output_dir`` and (when saving) ``checkpoint.dir`` are created and test-written
(:func:`training.writable.check_writable_dir`) before the model, the data and the first step; one
that cannot be written stops the job with exit code 2 and its path. Rank 0 then takes ``run.lock``
of each (:mod:`training.run_lock`): another live run there stops the job with exit code 2, before
anything is written; a lock that another run took over mid-run stops it before its next save.

Out of GPU memory at start-up (a checkpoint load included), in a step, a validation or a save
(``torch.OutOfMemoryError``, or CUDA's, NCCL's or cuBLAS's out-of-memory error, also inside torch DCP's
gathered load errors: :func:`training.out_of_memory.out_of_memory_error`): the rank that met it
says where, the plan's memory estimate, the peak allocation and what to change
(:func:`training.plan.out_of_memory_text`: in a step or a validation the largest smaller
micro-batch whose estimate fits the GPU), names the newest complete checkpoint, writes exit code 6 to
``$PRETRAIN_EXIT_FILE`` whatever its rank, and stops without saving and without another collective
call. With several ranks the others wait in a collective call it will never join: it leaves the
process at once (``os._exit``, after the logs are flushed) and the launcher ends them; only rank 0
records the exit event and the summary in ``metrics.jsonl``, so a run stopped by another rank's error
has its message in that rank's stderr only. Other errors end the run with a traceback (exit code 1).

``checkpoint.save: false`` (benchmarks): no checkpoint is ever written; the run must start fresh
(``checkpoint.load`` ``none``, or ``auto`` finding nothing, else exit code 2 before the model is
built); a signal or the time budget still stops the loop with exit code 3 / 4, and the exit event
says that nothing was saved.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

import torch

from data.errors import MissingDependencyError, make_dirs
from fp4_attention.backends import deterministic_mode as fa_deterministic_mode

from . import checkpoint as ckpt
from .config import TrainConfig
from .data_setup import DataBundle, build_data, micro_batches, validation_micro_batches
from .distenv import (
    DistEnv,
    all_gather_objects,
    init_distributed,
    init_model_parallel,
    ranks_from_env,
    shutdown,
)
from .metrics import MetricsLogger, run_meta
from .out_of_memory import out_of_memory_error
from .plan import Plan, check_corpus, format_plan, make_plan, out_of_memory_text
from .resolved import resolved_dict
from .run_lock import STALE_S, LockLost, RunLock
from .schedule import lr_at
from .signals import (
    EXIT_CONFIG,
    EXIT_DONE,
    EXIT_NONFINITE,
    EXIT_OUT_OF_MEMORY,
    EXIT_PREEMPTED,
    StartupStop,
    StopFlags,
    end_startup_stop,
    install_startup_stop,
    raise_pending_stop,
    restore_handlers,
    write_exit_code,
)
from .state import TrainerState
from .writable import check_writable_dir

__all__ = ["Trainer"]

NOT_SAVED = "; nothing saved (checkpoint.save=false)"


def _iterations(its: list[int], most: int = 6) -> str:
    """``10, 20, 30`` (the first and last few of a long list, with the count between)."""
    if len(its) <= most:
        return ", ".join(map(str, its))
    half = most // 2
    head, tail = ", ".join(map(str, its[:half])), ", ".join(map(str, its[-half:]))
    return f"{head}, ... ({len(its) - most} more), {tail}"


class Trainer:
    """Runs one training job; :meth:`run` returns the process exit code.

    Args:
        cfg: the validated config.
        log: receives human-readable lines (rank 0 only).
        log_error: receives the one configuration-error message that comes with exit code 2 (rank 0
            only; default: ``log``). The CLI passes a writer to stderr.
        inject_nan_steps: steps whose loss is multiplied by NaN (tests of the non-finite policy).
    """

    def __init__(
        self, cfg: TrainConfig, *, log=print, log_error=None, inject_nan_steps: frozenset[int] = frozenset()
    ):
        self.cfg = cfg  # _setup replaces it with the one whose attention backend is resolved
        self._print = log
        self._print_error = log if log_error is None else log_error
        self.inject_nan_steps = frozenset(inject_nan_steps)
        # set by run()
        self.env: DistEnv | None = None  # rank, world size, device
        self.log = None  # ``log`` on rank 0, a no-op on the other ranks
        # set by _setup(), in this order (a configuration error there leaves the later ones None)
        self.plan: Plan | None = None
        self.resolved: dict | None = None  # the resolved config (saved with the run and every checkpoint)
        self.output_dir: Path | None = None
        self.ckpt_root: Path | None = None  # checkpoint.dir, by default <output_dir>/checkpoints
        self.metrics: MetricsLogger | None = None
        self.resumed_from: Path | None = None  # the checkpoint this run resumed from (None: a fresh start)
        # [key, value in that checkpoint, value now] of each config difference allowed at the resume
        # (checkpoint.allow_config_change), recorded in the resume event (training.records)
        self.allowed_changes: list[list] = []
        self.layer_spec: str | None = None  # "transformer_engine" or "local", once the engine is built
        self._resume_root: Path | None = None  # the directory a damaged checkpoint falls back in
        self._origin: str | None = None  # the checkpoint a checkpoint.load=<path> trajectory starts from
        self.engine = None  # MegatronEngine (CUDA) or CPUEngine, see training.engine
        self.dp_rank: int | None = None  # this rank's place in the data-parallel group (its data shard)
        self.dp_size: int | None = None
        self.data: DataBundle | None = None
        self.state = TrainerState()  # the counters a checkpoint saves, restored on resume
        # set by the first _validate()
        self._val_batches: list[dict] | None = None  # the same validation micro-batches every time
        # set after an out-of-memory error with several ranks: the others are in a collective call
        # this rank will never join, so the process is left at once (run()), the group not destroyed
        self._abandon_group = False
        # rank 0's run.lock of the output directory and, when saving, of the checkpoint directory
        self._locks: list[RunLock] = []

    # ----------------------------------------------------------------------------- set-up
    def run(self) -> int:
        """Train (module docstring); returns the exit code (``training.signals``)."""
        previous = install_startup_stop()  # SIGTERM/SIGUSR1 before the loop: exit code 3 at once
        try:
            raise_pending_stop()  # one that pretrain_llama.main recorded before (install_deferred_stop)
            return self._run_process()
        except StartupStop as stop:
            return self._stopped_at_startup(stop.signum)
        finally:
            restore_handlers(previous)

    def _stopped_at_startup(self, signum: int) -> int:
        """The line (rank 0, stderr) and the exit event (where the metrics file is open) of a SIGTERM
        or SIGUSR1 during the start-up; :data:`EXIT_PREEMPTED`."""
        root = self.ckpt_root
        held = ckpt.complete_iterations(root) if root is not None else []
        where = f"the newest complete checkpoint in {root}" if held else "step 0 (no checkpoint yet)"
        text = (
            f"preempted ({signal.Signals(signum).name}) during start-up, before this launch's first step: "
            f"nothing to save; the same command relaunched resumes from {where}"
        )
        if self.metrics is not None and self.metrics.enabled:  # rank 0, its log and metrics.jsonl
            self.metrics.event(self._stop_step(), "exit", text)
        elif ranks_from_env()[0] == 0:
            self._print_error(f"pretrain_llama: {text}")
        return EXIT_PREEMPTED

    def _stop_step(self) -> int:
        """The step an exit event outside the loop names: the last completed one, or at start-up the
        iteration of the checkpoint being resumed (0 for a fresh start)."""
        step = self.state.iteration
        if not step and self.resumed_from is not None:
            step = ckpt.iteration_of(self.resumed_from) or 0
        return step

    def _run_process(self) -> int:
        cfg = self.cfg
        use_cuda = torch.cuda.is_available()
        # torch's deterministic mode as found, restored at the end: a run leaves it as it was
        was = torch.are_deterministic_algorithms_enabled()
        was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        if cfg.runtime.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        self.env = env = init_distributed(use_cuda=use_cuda)
        self.log = self._print if env.is_main else (lambda *_: None)
        self.log_error = self._print_error if env.is_main else (lambda *_: None)
        try:
            return self._run(use_cuda)
        except StartupStop as stop:  # before the loop: its metrics file, if any, still open
            return self._stopped_at_startup(stop.signum)
        finally:
            if self.metrics is not None:
                self.metrics.close()
            self._release_locks()
            if self._abandon_group:  # see _out_of_memory: no destructor may wait on the other ranks
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(EXIT_OUT_OF_MEMORY)
            shutdown(env)
            torch.use_deterministic_algorithms(was, warn_only=was_warn_only)

    def _setup(self, use_cuda: bool):
        """Everything that can fail because of the config, the data or the checkpoint to resume.

        Such errors are ``ValueError`` (the config sections', :class:`data.errors.DataError`,
        :class:`training.checkpoint.ConfigMismatchError`, a checkpoint whose shapes do not fit the
        model) or :class:`data.errors.MissingDependencyError`: exit code 2 with the message.
        """
        cfg, env, log = self.cfg, self.env, self.log
        self.plan = make_plan(cfg, env.world_size)
        check_corpus(cfg, self.plan)  # not 100B tokens of the embedded sample corpus
        # the deterministic mode the attention calls will see (interface.attention reads torch's):
        # runtime.deterministic sets it in run(), but it may be on already (an earlier run in-process)
        deterministic = cfg.runtime.deterministic or fa_deterministic_mode()
        try:
            attention, why = cfg.attention.resolve(
                torch.device("cuda" if use_cuda else "cpu"), deterministic=deterministic
            )
        except ValueError as err:  # the library's words name its argument; the config key is the user's
            raise ValueError(
                f"attention.backend={cfg.attention.backend}: {err} (in the config: attention.backend=auto "
                "picks the fastest that runs here, attention.backend=reference runs anywhere)"
            ) from None
        self.cfg = cfg = cfg.replace(attention=attention)
        self.resolved = resolved_dict(cfg)
        self.output_dir = make_dirs(cfg.runtime.output_dir, what="the run directory (runtime.output_dir)")
        if (self.output_dir / cfg.logging.metrics_file).is_dir():
            raise ValueError(
                f"logging.metrics_file={cfg.logging.metrics_file!r} names the directory "
                f"{self.output_dir / cfg.logging.metrics_file}; name a file, e.g. metrics.jsonl"
            )
        self.ckpt_root = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else self.output_dir / "checkpoints"
        self._check_writable()
        self._lock_dirs()
        if cfg.logging.wandb_mode != "disabled" and importlib.util.find_spec("wandb") is None:
            # every rank, before anything is written (found in review, 2026-12-06: the run went on
            # without wandb, and its summary said logging.wandb_mode=disabled)
            raise MissingDependencyError(
                f"logging.wandb_mode={cfg.logging.wandb_mode} needs the 'wandb' package, which is not "
                "installed here: pip install -e '.[wandb]' in the job's environment, or "
                "logging.wandb_mode=disabled"
            )
        self.metrics = MetricsLogger(self.output_dir, cfg=cfg, enabled=env.is_main, log=log)
        log(
            f"pretrain_llama: {'CUDA' if use_cuda else 'CPU'} run, {env.world_size} process(es), "
            f"output {self.output_dir}"
        )
        log(format_plan(self.plan))
        log(f"attention: recipe {attention.get_recipe().label}, backend {attention.backend} ({why})")
        if use_cuda:
            log(
                f"MFU = tokens/s/GPU x {self.plan.flops_per_token:.4e} FLOPs/token (6*N_matmul + 6*L*s*Hq*d: "
                f"forward+backward, causal attention) / {cfg.logging.peak_flops_per_gpu / 1e12:.1f} TFLOP/s "
                "peak"
            )
        else:
            log("MFU: not reported on CPU (null in metrics.jsonl)")
        self.resumed_from = self._find_checkpoint()
        if cfg.checkpoint.save:
            every = f"every {cfg.checkpoint.save_interval} steps, " if cfg.checkpoint.save_interval else ""
            log(f"checkpoints: {self.ckpt_root} ({every}at the end, on SIGTERM/SIGUSR1 and the time budget)")
        else:
            if self.resumed_from is not None:
                raise ValueError(
                    f"checkpoint.save=false must start fresh, but checkpoint.load=auto found "
                    f"{self.resumed_from}; set checkpoint.load=none (train from scratch and write "
                    "nothing) or use another runtime.output_dir / checkpoint.dir"
                )
            log(
                "checkpoints: disabled (checkpoint.save=false): nothing is written, neither every "
                "save_interval "
                "steps nor at the end, nor on SIGTERM/SIGUSR1 or the time budget"
            )

        init_model_parallel(cfg.parallel, seed=cfg.training.seed, use_cuda=use_cuda)
        llama_cfg = cfg.llama()
        if use_cuda:
            from .engine_megatron import MegatronEngine

            self.engine = MegatronEngine(cfg, llama_cfg, env, log=log)
        else:
            from .engine_cpu import CPUEngine

            self.engine = CPUEngine(cfg, llama_cfg, env, log=log)
        raise_pending_stop()  # a signal recorded inside an import (training.signals)
        log(f"engine: {self.engine.describe}")
        from llama.specs import uses_transformer_engine

        # the layer spec the engine built (llama.specs' rule): recorded in run_meta.json, so that arms
        # with transformer_impl=auto built on machines with and without TE are not compared as one job
        self.layer_spec = "transformer_engine" if uses_transformer_engine(llama_cfg) else "local"
        from megatron.core import parallel_state

        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.data = build_data(cfg, model_vocab_size=llama_cfg.vocab_size, log=log)
        raise_pending_stop()
        log(f"data: {self.data.describe}; train identity {self.data.identity}")

        saved = TrainerState()  # a fresh start: every counter at 0
        if self.resumed_from is not None:
            saved = self._resume()
            raise_pending_stop()
        # the counters go on from the checkpoint's; the data identity and the world size are this run's,
        # and so is the origin where checkpoint.load named where the trajectory starts
        origin = saved.origin if self._origin is None else self._origin
        self.state = dataclasses.replace(
            saved,
            data_identity=self.data.identity,
            world_size=env.world_size,
            origin=origin,
            data_content=self.data.content,
        )

    def _check_writable(self) -> None:
        """Exit code 2 (a ValueError) naming the directory, on every rank, when one cannot be written:
        the output directory (rank 0 writes it), the checkpoint directory (every rank writes there)."""
        dirs = [(self.output_dir, "runtime.output_dir")] if self.env.is_main else []
        if self.cfg.checkpoint.save:
            dirs.append((self.ckpt_root, "checkpoint.dir"))
        error = None
        for path, name in dirs:
            try:
                check_writable_dir(path, name)
            except ValueError as err:
                error = str(err)
                break
        errors = all_gather_objects(error, self.env)
        for rank, error in enumerate(errors):
            if error is not None:
                on = f" (on rank {rank})" if self.env.world_size > 1 else ""
                raise ValueError(f"{error}{on}; checked at start-up, before the first step")

    def _lock_dirs(self) -> None:
        """Rank 0 takes ``run.lock`` of the output directory and, when saving, of the checkpoint
        directory (:mod:`training.run_lock`: another live run there is exit code 2, before anything
        is written; a dead one's lock is taken over, after watching it where it cannot be told dead
        at once). Every rank gets rank 0's answer. The checkpoint directory has a lock of its own
        also inside the output directory (``<output_dir>/checkpoints``): another run may name it as
        its ``checkpoint.dir`` from another output directory (found in review, 2026-12-06)."""
        error = None
        if self.env.is_main:
            dirs = [(self.output_dir, "runtime.output_dir")]
            if self.cfg.checkpoint.save and self.ckpt_root.resolve() != self.output_dir.resolve():
                dirs.append((self.ckpt_root, "checkpoint.dir"))
            try:
                for path, key in dirs:
                    self._locks.append(RunLock.acquire(path, key=key, log=self.log))
            except ValueError as err:
                error = str(err)
        error = self._rank0(error)
        if error is not None:
            raise ValueError(error)

    def _release_locks(self) -> None:
        for lock in reversed(self._locks):
            lock.release()
        self._locks = []

    def _lock_lost(self) -> str | None:
        """Rank 0's word, on every rank, when another run took over a lock of this run: its holder."""
        lost = next((f"{lock.path} ({lock.lost})" for lock in self._locks if lock.lost), None)
        return self._rank0(lost)

    def _verify(self, path: Path) -> str | None:
        """:func:`training.checkpoint.verify_checkpoint` with the checksums shared over the ranks:
        the same answer on every rank (the first reason any rank found)."""
        reason = ckpt.verify_checkpoint(path, shard=(self.env.rank, self.env.world_size))
        return next((r for r in all_gather_objects(reason, self.env) if r is not None), None)

    def _rank0(self, value):
        """Rank 0's ``value`` on every rank (every rank must call it): what one rank read of a
        checkpoint directory decides which checkpoints every rank verifies together."""
        return all_gather_objects(value, self.env)[0]

    def _same_trajectory(self, candidate: Path, failed: Path) -> bool | None:
        """:func:`training.checkpoint.same_trajectory` decided on rank 0 and shared: every rank then
        verifies the same checkpoints (``_verify`` is a collective), whatever a rank's reads gave."""
        return self._rank0(ckpt.same_trajectory(candidate, failed) if self.env.rank == 0 else None)

    def _latest(self, root: Path, *, before: int | None = None) -> Path | None:
        """The newest usable checkpoint under ``root`` (below ``before``), None when ``root`` has no
        ``iter_*`` directory; a ValueError when it has some but none is usable. A fall-back to an
        ancestor on the failed checkpoint's trajectory (``find_latest``'s ``trace``) makes this run a
        trajectory started from that ancestor, as ``checkpoint.load`` of it would, where no
        ``checkpoint.load=<path>`` set one (found in review, 2026-12-06: resumed from a rollback's
        start checkpoint, the run's saves took the rolled-back run's identity, and pruning and the
        next fall-back counted that run's checkpoints as its own)."""
        trace: dict = {}
        found = ckpt.find_latest(
            root,
            warn=self.log,
            verify=self._verify,
            before=before,
            same=self._same_trajectory,
            trace=trace,
            share=self._rank0,
        )
        if found is not None:
            if "origin" in trace and self._origin is None:
                self._origin = trace["origin"]
            return found[1]
        tried = [it for it in ckpt.complete_iterations(root) if before is None or it <= before]
        if not tried:
            return None
        raise ckpt.NoUsableCheckpointError(
            f"no usable checkpoint under {root}: iteration(s) {', '.join(map(str, tried))} are incomplete "
            "or damaged, or another trajectory's than the one that failed (the warnings above name the "
            "files and how to resume another trajectory's); restore a copy, or start fresh in another "
            "runtime.output_dir or checkpoint.dir; nothing was deleted"
        )

    def _find_checkpoint(self) -> Path | None:
        """The checkpoint this launch resumes from (``checkpoint.load``), None for a fresh start.

        Raises:
            ValueError: ``checkpoint.load=none`` with saves into a ``checkpoint.dir`` that holds
                ``iter_*`` directories (a fresh run's saves would be mixed with them, and replace
                those at its iterations: found in review, 2026-12-06, where the pruning of that
                time also deleted the new run's own); a named checkpoint that is not complete; a
                directory without a complete one; ``auto`` finding only damaged ones.
        """
        load = self.cfg.checkpoint.load
        if load == "none":
            held = ckpt.complete_iterations(self.ckpt_root) if self.cfg.checkpoint.save else []
            if held:
                raise ValueError(
                    f"checkpoint.load=none starts from scratch, but checkpoint.dir {self.ckpt_root} holds "
                    f"checkpoints (iteration(s) {_iterations(held)}) that this run's saves would be mixed "
                    "with, replacing those at the same iterations: to go on from them (a preempted run's "
                    "relaunch) set checkpoint.load=auto; to start from scratch use another "
                    "runtime.output_dir or checkpoint.dir; nothing was deleted"
                )
            return None
        self._resume_root = None  # where a damaged checkpoint may fall back to an older one
        self._origin = None  # checkpoint.load=<checkpoint or dir>: the checkpoint the trajectory starts from
        if load == "auto":
            self._resume_root = self.ckpt_root
            found = self._latest(self.ckpt_root)
        else:
            path = Path(load)
            if (path / ckpt.MANIFEST).exists() or path.name.startswith(ckpt.ITER_PREFIX):
                reason = self._verify(path)
                if reason:
                    raise ValueError(f"checkpoint.load={load}: not a complete checkpoint ({reason})")
                found = path
            else:
                self._resume_root = path
                found = self._latest(path)
                if found is None:
                    inner = path / "checkpoints"  # a run directory named instead of its checkpoints'
                    hint = (
                        f" (did you mean {inner}, the checkpoint directory inside it, or one of its "
                        f"{ckpt.ITER_PREFIX}* folders?)"
                        if ckpt.complete_iterations(inner)
                        else ""
                    )
                    raise ValueError(
                        f"checkpoint.load={load} holds no complete checkpoint{hint}; use "
                        "checkpoint.load=auto or none, or name a checkpoint directory or an iter_* folder"
                    )
        if load != "auto":
            # a trajectory started from this checkpoint: a relaunch with the same checkpoint.load (a
            # Slurm requeue reruns the same arguments) goes on from the trajectory's own newest save
            self._origin = str(found.resolve())
            own = self._own_newer_save(self._origin, found)
            if own is not None:
                self.log(
                    f"checkpoint: checkpoint.load={load} started this run, which has saved since: resuming "
                    f"from its own newest save, {own} (to start from {found} again, use another "
                    "runtime.output_dir or checkpoint.dir)"
                )
                found, self._resume_root = own, None  # a damaged own save stops: no other trajectory's
        self._note_no_checksums(found)
        self._note_later_checkpoints(found)
        return found

    def _own_newer_save(self, origin: str, start: Path) -> Path | None:
        """The newest complete checkpoint in ``checkpoint.dir`` above ``start``'s iteration whose
        trajectory began at ``origin`` (``checkpoint.origin_of``), None if there is none. Found in review
        (2026-12-06): a run rolled back by ``checkpoint.load=<iter path>`` and preempted went back to
        that checkpoint at every relaunch of the same command, losing its steps each time."""
        if not self.cfg.checkpoint.save:
            return None
        at = ckpt.iteration_of(start)
        own = []  # decided on rank 0: every rank verifies the same checkpoints (a collective)
        if self.env.rank == 0:
            for it in reversed(ckpt.complete_iterations(self.ckpt_root)):
                path = ckpt.iter_dir(self.ckpt_root, it)
                if at is not None and it <= at:
                    break
                if path.resolve() != start.resolve() and ckpt.origin_of(path) == origin:
                    own.append(it)
        for it in self._rank0(own):
            path = ckpt.iter_dir(self.ckpt_root, it)
            if self._verify(path) is None:
                return path
        return None

    def _note_later_checkpoints(self, found: Path | None) -> None:
        """Warn when ``checkpoint.dir`` holds iterations above the one resumed (a rollback by
        ``checkpoint.load=<path>`` or an edited marker, as Megatron-LM's): they stay where they are
        (``checkpoint.prune`` keeps them), nothing resumes from them, and a save at one of their
        iterations replaces it."""
        at = ckpt.iteration_of(found) if found is not None else None
        if at is None or not self.cfg.checkpoint.save:
            return
        later = [it for it in ckpt.complete_iterations(self.ckpt_root) if it > at]
        if later:
            self.log(
                f"checkpoint: WARNING: resuming from iteration {at}, while {self.ckpt_root} also holds "
                f"iteration(s) {_iterations(later)}: they are kept and not resumed from, and this run's "
                "save at one of those iterations replaces it"
            )

    def _note_no_checksums(self, path: Path | None) -> None:
        if path is not None and not ckpt.has_checksums(path):
            self.log(
                f"checkpoint: {path} has no checksums in its manifest (saved before they were recorded): "
                "checked file sizes only"
            )

    def _load(self, path: Path) -> TrainerState:
        """Trainer state, config check and engine state of checkpoint ``path``.

        Raises:
            DamagedCheckpointError: a file of it does not deserialize.
            ConfigMismatchError: the config differs (not a damage: no fall-back).
        """
        cfg = self.cfg
        try:
            saved = TrainerState.from_state_dict(ckpt.read_checkpoint_json(path / ckpt.TRAINER_STATE_FILE))
        except (KeyError, TypeError, AttributeError) as err:
            raise ckpt.DamagedCheckpointError(
                f"{path / ckpt.TRAINER_STATE_FILE} is not a trainer state ({type(err).__name__}: {err})"
            ) from None
        allowed = ckpt.check_resume_compatible(
            ckpt.read_checkpoint_json(path / ckpt.CONFIG_FILE),
            self.resolved,
            allow=cfg.checkpoint.allow_config_change,
            saved_data_identity=saved.data_identity,
            data_identity=self.data.identity,
            saved_data_content=saved.data_content,
            data_content=self.data.content,
            where=str(path),
        )
        for key, was, now in allowed:
            self.log(f"resume: allowed config change {key}: {was!r} -> {now!r}")
        self.engine.load(path, applied_updates=saved.applied_updates, saved_world_size=saved.world_size)
        self.allowed_changes = [[key, was, now] for key, was, now in allowed]
        return saved

    def _resume(self) -> TrainerState:
        """Load :attr:`resumed_from`; when it is damaged, warn and load the previous usable one.

        Raises:
            ValueError: on every rank, when any rank refused a pickle of the checkpoint
                (``checkpoint.UnsafeCheckpointError``: a torch_dist file, ``torch_dist_vetting``, or a
                Transformer Engine extra state, ``te_extra_state``; not a damage, so no fall-back to
                an older checkpoint; gathered so that no rank is left waiting in a collective).
        """
        while True:
            path = self.resumed_from
            damage = refused = None
            try:
                saved = self._load(path)
            except ckpt.DamagedCheckpointError as err:
                if out_of_memory_error(err) is not None:  # not damage: the start-up's out-of-memory stop
                    raise
                damage = str(err)
            except ckpt.UnsafeCheckpointError as err:
                refused = str(err)
            outcomes = all_gather_objects((damage, refused), self.env)
            refusals = [r for _, r in outcomes if r is not None]
            if refusals:
                raise ValueError(f"checkpoint {path} was not loaded: {refusals[0]}")
            damages = [d for d, _ in outcomes if d is not None]
            if not damages:
                return saved
            it = ckpt.iteration_of(path)
            if self._resume_root is None or it is None:
                raise ValueError(f"checkpoint.load={self.cfg.checkpoint.load}: {damages[0]}")
            self.log(f"checkpoint: WARNING: iteration {it} is damaged: {damages[0]}")
            self.resumed_from = self._latest(self._resume_root, before=it)
            if self.resumed_from is None:  # its directory vanished meanwhile
                raise ckpt.NoUsableCheckpointError(
                    f"{path} cannot be loaded ({damages[0]}) and no older checkpoint exists"
                )
            self.log(
                f"checkpoint: WARNING: resuming from the previous complete checkpoint, "
                f"{self.resumed_from.name}, instead of iteration {it}"
            )
            self._note_no_checksums(self.resumed_from)

    # ------------------------------------------------------------------------------- loop
    def _run(self, use_cuda: bool) -> int:
        cfg = self.cfg
        try:
            self._setup(use_cuda)
        except Exception as err:
            if (oom := out_of_memory_error(err)) is not None:  # first: a ValueError may carry one
                where = "at start-up (the model, the optimizer or the checkpoint load)"
                return self._out_of_memory(oom, where)
            if not isinstance(err, (ValueError, MissingDependencyError)):
                raise
            # config, plan, data, resume compatibility; a checkpoint directory with nothing to resume
            unusable = isinstance(err, ckpt.NoUsableCheckpointError)
            label = "cannot resume" if unusable else "configuration error"
            self.log_error(f"pretrain_llama: {label}: {err}")
            return EXIT_CONFIG
        m, eng, plan, st = self.metrics, self.engine, self.plan, self.state
        m.write_meta(
            run_meta(
                resolved=self.resolved,
                dataset_identity=self.data.identity,
                world_size=self.env.world_size,
                data_content=self.data.content,
                layer_spec=self.layer_spec,
            )
        )
        if self.resumed_from is not None:
            detail = f"from {self.resumed_from} (consumed_samples {st.consumed_samples})"
            if self.allowed_changes:
                detail += f"; allowed config changes: {', '.join(c[0] for c in self.allowed_changes)}"
            m.event(st.iteration, "resume", detail, allowed_changes=self.allowed_changes)
        else:
            if m.enabled and m.earlier_train_steps is not None:  # found in review, 2026-12-06
                n, first, last = m.earlier_train_steps
                self.log(
                    f"metrics: WARNING: a fresh start, but {m.path} already holds {n} training record(s) of "
                    f"an earlier run (steps {first}-{last}): this run's are appended after them, and the "
                    "readers of the file (training.records) read only this run's from here on; use another "
                    "runtime.output_dir to keep runs apart"
                )
            m.event(0, "start", f"fresh start, {cfg.train_iters} steps")
        total = cfg.train_iters
        if st.iteration >= total:
            m.event(
                st.iteration,
                "exit",
                f"done: already trained {st.iteration} of {total} steps (to train again, use another "
                "runtime.output_dir or checkpoint.dir)",
            )
            return EXIT_DONE

        telemetry = None
        if cfg.logging.telemetry_interval and self.env.is_main:
            from .telemetry import AttentionTelemetry

            telemetry = AttentionTelemetry(eng.model)
        end_startup_stop()  # from here the loop's handlers: finish the step, save, exit 3
        flags = StopFlags(
            exit_duration_mins=cfg.runtime.exit_duration_mins,
            saving=cfg.checkpoint.save,
            announce=self.env.is_main,
        )
        flags.install()
        data_iter = micro_batches(
            self.data, cfg, consumed_samples=st.consumed_samples, dp_rank=self.dp_rank, dp_size=self.dp_size
        )
        tr = cfg.training
        gbs, seq = tr.global_batch_size, cfg.data.seq_length
        saving = cfg.checkpoint.save
        m.start_progress(
            st.iteration,
            start_tokens=st.consumed_tokens,
            on_gpu=use_cuda,
            world_size=self.env.world_size,
            flops_per_token=plan.flops_per_token,
        )
        where = "before the first step"
        try:
            while st.iteration < total:
                step = st.iteration + 1
                where = f"in step {step}"
                t0 = time.perf_counter()
                batch = [next(data_iter) for _ in range(plan.accumulation)]
                lr = lr_at(
                    step, max_lr=tr.lr, min_lr=tr.min_lr, warmup_iters=tr.warmup_iters, total_iters=total
                )
                sample = telemetry is not None and step % cfg.logging.telemetry_interval == 0
                if sample:
                    telemetry.arm()
                result = eng.train_step(batch, lr=lr, inject_nan=step in self.inject_nan_steps)
                if use_cuda:
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                st.iteration = step
                st.consumed_samples += gbs
                st.consumed_tokens += gbs * seq
                st.nonfinite_count += int(result.skipped)
                tps = gbs * seq / dt / self.env.world_size
                m.train(
                    step=step,
                    consumed_samples=st.consumed_samples,
                    consumed_tokens=st.consumed_tokens,
                    loss=result.loss,
                    grad_norm=result.grad_norm,
                    lr=lr,
                    step_time_s=dt,
                    tokens_per_s_per_gpu=tps,
                    mfu=tps * plan.flops_per_token / cfg.logging.peak_flops_per_gpu if use_cuda else None,
                    peak_mem_gib=eng.peak_mem_gib(),
                    skipped=result.skipped,
                    nonfinite_count=st.nonfinite_count,
                )
                if sample:
                    for layer, (max_logit, zero_frac) in sorted(telemetry.collect().items()):
                        m.record(
                            {
                                "kind": "telemetry",
                                "step": step,
                                "layer": layer,
                                "max_logit": max_logit,
                                "zero_scale_block_frac": zero_frac,
                            }
                        )
                if result.skipped and cfg.runtime.nonfinite == "stop":
                    last = self._newest_checkpoint()
                    self._exit(
                        step,
                        EXIT_NONFINITE,
                        f"non-finite loss ({result.loss}) or gradients at step {step}; stopping "
                        "without saving (runtime.nonfinite=stop). Last complete checkpoint: "
                        f"{last or 'none'}. Set runtime.nonfinite=skip to skip such "
                        "steps instead",
                    )
                    return EXIT_NONFINITE
                if cfg.validation.interval and cfg.validation.iters and step % cfg.validation.interval == 0:
                    where = f"in the validation after step {step}"
                    self._validate(step)
                where = f"after step {step}"
                reason = eng.all_reduce_max(flags.local_reason())
                if reason:
                    if saving:
                        where = f"while saving the checkpoint of step {step}"
                        self._save(step)
                        eng.poll_saves(blocking=True)
                    self._exit(step, reason, flags.describe(reason) + ("" if saving else NOT_SAVED))
                    return reason
                if (
                    saving
                    and cfg.checkpoint.save_interval
                    and step % cfg.checkpoint.save_interval == 0
                    and step < total
                ):
                    where = f"while saving the checkpoint of step {step}"
                    self._save(step)
                where = f"after step {step}"
                eng.poll_saves(blocking=False)
            if cfg.validation.interval and cfg.validation.iters and total % cfg.validation.interval:
                where = f"in the validation after step {total}"
                self._validate(total)
            if saving:
                where = f"while saving the checkpoint of step {total}"
                self._save(total)
                eng.poll_saves(blocking=True)
            self._exit(
                total,
                EXIT_DONE,
                f"done: {total} steps, {st.consumed_tokens:,} tokens, "
                f"{st.nonfinite_count} non-finite step(s) skipped" + ("" if saving else NOT_SAVED),
            )
            return EXIT_DONE
        except LockLost as err:
            self._exit(st.iteration, EXIT_CONFIG, str(err))
            return EXIT_CONFIG
        except Exception as err:
            if (oom := out_of_memory_error(err)) is None:
                raise
            return self._out_of_memory(oom, where)
        finally:
            flags.uninstall()
            if telemetry is not None:
                telemetry.remove()

    def _out_of_memory(self, err: BaseException, where: str) -> int:
        """Stop on ``err`` (see the module docstring): exit code 6 in ``$PRETRAIN_EXIT_FILE`` from this
        rank; on rank 0 the message is the exit event (log and metrics.jsonl) with the run summary,
        another rank (or rank 0 before its metrics file exists) writes it to stderr with its rank. No
        save, no collective call. Returns :data:`EXIT_OUT_OF_MEMORY`."""
        env, cfg = self.env, self.cfg
        on_gpu = torch.cuda.is_available()
        peak = self.engine.peak_mem_gib() if self.engine is not None and on_gpu else None
        memory = (
            torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory if on_gpu else None
        )
        activations = where.startswith(("in step", "in the validation"))
        expandable = "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").lower()
        text = out_of_memory_text(
            cfg,
            self.plan,
            where=where,
            error=err,
            peak_gib=peak,
            activations=activations,
            gpu_memory_bytes=memory,
            expandable_segments=expandable,
        )
        newest = self._newest_checkpoint() if self.ckpt_root is not None else None
        if newest is None:
            text += f". No complete checkpoint in {self.ckpt_root}: a relaunch starts from step 0"
        elif cfg.checkpoint.load == "auto":
            text += ". Nothing was saved after the error; relaunched with the change, the run resumes from "
            text += str(newest)
        else:
            text += (
                f". Nothing was saved after the error; the newest complete checkpoint is {newest} "
                f"(checkpoint.load={cfg.checkpoint.load} decides what a relaunch loads)"
            )
        write_exit_code(EXIT_OUT_OF_MEMORY, any_rank=True)
        if self.metrics is not None and self.metrics.enabled:  # rank 0: the exit event and summary
            self._exit(self._stop_step(), EXIT_OUT_OF_MEMORY, text)
        else:
            rank = f"rank {env.rank}: " if env.world_size > 1 else ""
            self._print_error(f"pretrain_llama: {rank}{text}")
        self._abandon_group = env.world_size > 1
        return EXIT_OUT_OF_MEMORY

    def _newest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint by sizes (no checksum pass: this only names it)."""
        found = ckpt.find_latest(
            self.ckpt_root, warn=lambda *_: None, verify=lambda p: ckpt.verify_checkpoint(p, checksums=False)
        )
        return None if found is None else found[1]

    def _exit(self, step: int, code: int, detail: str) -> None:
        """The exit event and the run summary (where the files are, how the run resumes)."""
        saving = self.cfg.checkpoint.save and self.env.is_main
        self.metrics.exit(
            step,
            code,
            detail,
            checkpoints=self.ckpt_root if saving else None,
            newest_checkpoint=self._newest_checkpoint() if saving else None,
        )

    def _validate(self, step: int) -> None:
        if self._val_batches is None:
            self._val_batches = validation_micro_batches(
                self.data, self.cfg, dp_rank=self.dp_rank, dp_size=self.dp_size
            )
        if not self._val_batches:
            return
        self.metrics.valid(step, self.state.consumed_tokens, self.engine.eval_loss(self._val_batches))

    def _save(self, step: int) -> None:
        eng, root = self.engine, self.ckpt_root
        eng.poll_saves(blocking=True)  # one save in flight at a time
        lost = self._lock_lost()
        if lost is not None:
            raise LockLost(
                f"another run took over the lock {lost} while this one ran (its heartbeat stalled for "
                f"longer than {STALE_S:.0f} s): the checkpoint of step {step} was not saved, so as not to "
                "write into that run's directory. Check which run should go on there; relaunched, this "
                "one resumes from its newest complete checkpoint once the directory is its own again"
            )
        if not eng.params_finite():
            self.metrics.event(
                step, "save", "NOT saved: the parameters are not finite (a non-finite state is never saved)"
            )
            return
        if self.env.is_main:
            ckpt.prepare_tmp_dir(root, step)
        eng.barrier()
        tmp = ckpt.tmp_dir(root, step)
        state = self.state.state_dict()  # a copy: an asynchronous save is finalized after later steps
        t0 = time.perf_counter()

        def finalize():
            eng.barrier()
            t1 = time.perf_counter()
            share = ckpt.checksum_shard(tmp, self.env.rank, self.env.world_size)
            shares = all_gather_objects(share, self.env)
            if self.env.is_main:
                final = ckpt.finish_save(
                    root,
                    step,
                    tmp,
                    config=self.resolved,
                    trainer_state=state,
                    keep_last=self.cfg.checkpoint.keep_last,
                    checksums={rel: crc for share in shares for rel, crc in share.items()},
                )
                self.metrics.event(
                    step,
                    "save",
                    f"{final} ({time.perf_counter() - t0:.1f} s, of which {ckpt.CHECKSUM} checksums "
                    f"{time.perf_counter() - t1:.1f} s)",
                )
            eng.barrier()

        eng.save(tmp, finalize)
