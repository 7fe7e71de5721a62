"""The GPU engine: megatron-core end to end (DDP, distributed optimizer, schedules, dist_checkpointing).

* Model: ``llama.build_gpt_model`` (BF16 parameters) wrapped in ``Float16Module`` (FP32 loss output)
  and megatron-core ``DistributedDataParallel`` with ``grad_reduce_in_fp32=True`` (FP32 ``main_grad``
  buffers) and ``use_distributed_optimizer=True``.
* Optimizer: ``get_megatron_optimizer(OptimizerConfig(optimizer="adam", bf16=True,
  use_distributed_optimizer=True, ...))``: FP32 main weights sharded over data-parallel ranks. Its
  Adam is Transformer Engine's FusedAdam when TE imports, else Apex's, else ``torch.optim.AdamW``,
  which we switch to its fused CUDA kernel (``fused=True``). :attr:`MegatronEngine.describe` says
  which one runs. LR and weight decay are written into the param groups every step from
  :func:`training.schedule.lr_at` (not megatron's ``OptimizerParamScheduler``), so both engines
  share one schedule; megatron's ``wd_mult`` (0 for biases and 1-D parameters) is honoured.
* Step: ``get_forward_backward_func()`` runs the micro-batches (gradient accumulation, and the
  pipeline schedule when PP > 1) and ``finalize_model_grads`` (DP reduce-scatter); then a global
  finiteness check of the loss and the gradient buffers (megatron's BF16 optimizer has no
  inf/NaN check of its own), then ``optimizer.step()`` (clipping, update, parameter all-gather).
* Checkpoint: ``dist_checkpointing.save/load`` (torch_dist format, fully parallel save over the
  data-parallel group) of ``{"model": GPTModel.sharded_state_dict(), "optimizer":
  optimizer.sharded_state_dict(..., metadata={"distrib_optim_sharding_type": "dp_reshardable"})}``
  (``dp_reshardable``: the data-parallel size may change on resume; tensor/pipeline sizes may not).
  Per-rank RNG states (CUDA and megatron's tracker included) go into ``rng/rank_XXXXX.pt``.
  ``checkpoint.async_save``: megatron-core's own asynchronous writer (``async_strategy="mcore"``,
  a forked process per save; no nvidia-resiliency-ext needed); completion (manifest, rename,
  latest marker) runs when the write has finished, polled after every step.

Deterministic mode (``runtime.deterministic``): ``torch.use_deterministic_algorithms(True)`` and
``CUBLAS_WORKSPACE_CONFIG`` (set by the trainer), and megatron's ``deterministic_mode``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import rng_file
from .engine import (
    StepResult,
    check_tensor_shapes,
    load_weights_only,
    restore_rng_state,
    save_rng_state,
)
from .te_extra_state import allow_vetted_te_extra_state
from .torch_dist_vetting import (
    data_only_torch_load,
    dist_load_error,
    read_metadata,
    vet_torch_dist_checkpoint,
)

__all__ = ["MegatronEngine"]

CKPT_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def _ignore_stop_signals() -> None:
    """Initializer of the checkpoint writer's results-queue manager process (see below)."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)


_RESULTS_MANAGER = None


def _signal_proof_write_results_queue() -> None:
    """Give megatron-core's checkpoint writer a results queue whose manager process survives SIGTERM.

    ``dist_checkpointing``'s torch_dist writer (``filesystem_async.get_write_results_queue``) puts its
    write results into a ``multiprocessing.Manager().Queue()``, whose server process is a child of the
    rank. torchrun stops its workers with ``os.killpg`` (each worker leads its own process group), so
    a preemption SIGTERM also reaches that server process, which dies; the rank, which catches
    SIGTERM to save and exit, then fails in the save with ``BrokenPipeError`` (seen on 4 H200s,
    2026-11-29: exit 1, no checkpoint at the preemption step). The same queue, from a manager process
    that ignores SIGTERM/SIGINT/SIGUSR1, is installed once per process before the first save.
    """
    global _RESULTS_MANAGER
    import multiprocessing as mp
    from multiprocessing.managers import SyncManager

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is not None:
        return
    _RESULTS_MANAGER = SyncManager(ctx=mp.get_context("spawn"))
    _RESULTS_MANAGER.start(initializer=_ignore_stop_signals)
    filesystem_async._results_queue = _RESULTS_MANAGER.Queue()


def dcp_tensor_shapes(ckpt: Path) -> dict[str, tuple[int, ...]]:
    """Global shape of every tensor in a torch_dist checkpoint, from its ``.metadata`` (no tensor is
    read; unpickled with an allow-list, ``torch_dist_vetting.read_metadata``).

    Raises:
        DamagedCheckpointError: ``.metadata`` is missing or does not deserialize (names the file), so
            that the trainer falls back to the previous checkpoint as for any other damaged file.
        UnsafeCheckpointError: ``.metadata`` references a global outside the allow-list.
    """
    return tensor_shapes(read_metadata(ckpt))


def tensor_shapes(metadata) -> dict[str, tuple[int, ...]]:
    """Global shape of every tensor of a torch DCP ``Metadata``, by checkpoint key."""
    return {k: tuple(m.size) for k, m in metadata.state_dict_metadata.items() if hasattr(m, "size")}


def sharded_tensor_shapes(sharded_state_dict: dict) -> dict[str, tuple[int, ...]]:
    """Global shape of every ``ShardedTensor`` of a megatron-core sharded state dict, by checkpoint key.

    Factories (the SwiGLU ``linear_fc1`` of a tensor-parallel split) and objects are left out: a
    change of model shape shows in the plain tensors (embedding, norms, projections) first.
    """
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return {
        t.key: tuple(t.global_shape)
        for t in nested_values(sharded_state_dict)
        if isinstance(t, ShardedTensor)
    }


def _inner_optimizers(optimizer):
    chained = getattr(optimizer, "chained_optimizers", None)
    return list(chained) if chained is not None else [optimizer]


class MegatronEngine:
    def __init__(self, cfg, llama_cfg, env, *, log=print):
        from megatron.core import parallel_state
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.transformer.module import Float16Module

        from llama import build_gpt_model

        self.cfg, self.env, self.log = cfg, env, log
        self.device = env.device
        self.seq_length = cfg.data.seq_length
        self.micro_batch_size = cfg.training.micro_batch_size
        self.is_last_stage = parallel_state.is_pipeline_last_stage()
        torch.manual_seed(cfg.training.seed)
        self.model = build_gpt_model(
            llama_cfg,
            parallel=cfg.parallel,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=self.is_last_stage,
            use_cpu_initialization=cfg.training.use_cpu_initialization,
        )
        tc = self.model.config
        if cfg.runtime.deterministic:
            tc.deterministic_mode = True
        module = Float16Module(tc, self.model) if tc.bf16 else self.model
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            use_distributed_optimizer=True,
            overlap_grad_reduce=False,
            overlap_param_gather=False,
        )
        self.ddp = DistributedDataParallel(config=tc, ddp_config=ddp_config, module=module)
        self.ddp.broadcast_params()
        t = cfg.training
        opt_config = OptimizerConfig(
            optimizer="adam",
            lr=t.lr,
            min_lr=t.min_lr,
            weight_decay=t.weight_decay,
            adam_beta1=t.adam_beta1,
            adam_beta2=t.adam_beta2,
            adam_eps=t.adam_eps,
            clip_grad=t.clip_grad,
            bf16=tc.bf16,
            params_dtype=tc.params_dtype,
            use_distributed_optimizer=True,
        )
        self.optimizer = get_megatron_optimizer(opt_config, [self.ddp])
        adam = self._use_fused_adam()
        tc.no_sync_func = self.ddp.no_sync
        tc.finalize_model_grads_func = finalize_model_grads
        tc.grad_scale_func = self.optimizer.scale_loss
        self.forward_backward = get_forward_backward_func()
        self.async_queue = None
        if cfg.checkpoint.save:
            _signal_proof_write_results_queue()
        if cfg.checkpoint.async_save:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            self.async_queue = AsyncCallsQueue(persistent=False)
        self.describe = (
            f"megatron-core: GPTModel (BF16 params) in Float16Module + DistributedDataParallel "
            f"(FP32 grad buffers, distributed optimizer, DP={parallel_state.get_data_parallel_world_size()}) "
            f"+ {type(self.optimizer).__name__} with {adam}; dist_checkpointing torch_dist "
            f"({'async' if self.async_queue else 'synchronous'} save)"
        )

    def _use_fused_adam(self) -> str:
        """Name the Adam implementation; switch torch's AdamW fallback to its fused CUDA kernel."""
        names = set()
        for opt in _inner_optimizers(self.optimizer):
            inner = getattr(opt, "optimizer", None)
            if inner is None:
                continue
            if isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
                for group in inner.param_groups:
                    group["fused"], group["foreach"] = True, False
                inner.defaults["fused"], inner.defaults["foreach"] = True, False
                names.add(
                    f"torch.optim.{type(inner).__name__}(fused=True) (Transformer Engine / Apex not "
                    "installed)"
                )
            else:
                names.add(f"{type(inner).__module__}.{type(inner).__name__}")
        return ", ".join(sorted(names)) or "no local parameters"

    # ------------------------------------------------------------------------------ step
    def _forward_step(self, data_iterator, model, *, inject_nan: bool = False):
        mb = next(data_iterator)
        tokens = mb["tokens"].to(self.device, non_blocking=True)
        labels = mb["labels"].to(self.device, non_blocking=True)
        mask = mb["loss_mask"].to(self.device, non_blocking=True)
        position_ids = mb["position_ids"].to(self.device, non_blocking=True)
        output = model(input_ids=tokens, position_ids=position_ids, attention_mask=None, labels=labels)
        return output, partial(self._loss_func, mask, inject_nan)

    @staticmethod
    def _loss_func(loss_mask, inject_nan, output_tensor):
        losses = output_tensor.float().view(-1)
        mask = loss_mask.view(-1).float()
        loss = torch.sum(losses * mask)
        if inject_nan:
            loss = loss * float("nan")
        num_tokens = mask.sum().to(torch.int)
        report = torch.cat([loss.detach().view(1), num_tokens.float().view(1)])
        # 3-tuple: megatron divides the loss by num_tokens and the number of micro-batches
        return loss, num_tokens, {"lm loss": report}

    def _run(self, micro_batches, *, forward_only: bool, inject_nan: bool = False):
        return self.forward_backward(
            forward_step_func=partial(self._forward_step, inject_nan=inject_nan),
            data_iterator=iter(micro_batches),
            model=[self.ddp],
            num_microbatches=len(micro_batches),
            seq_length=self.seq_length,
            micro_batch_size=self.micro_batch_size,
            forward_only=forward_only,
        )

    def train_step(self, micro_batches: list[dict], *, lr: float, inject_nan: bool = False) -> StepResult:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        reports = self._run(micro_batches, forward_only=False, inject_nan=inject_nan)
        stats = torch.zeros(3, dtype=torch.float32, device=self.device)
        if self.is_last_stage and reports:
            per_mb = torch.stack([r["lm loss"][0] / r["lm loss"][1] for r in reports])
            stats[0] = per_mb.mean()
            stats[1] = 1.0
        buffers = list(self.ddp.buffers) + list(getattr(self.ddp, "expert_parallel_buffers", []))
        finite = torch.stack([torch.isfinite(b.grad_data).all() for b in buffers]).all() if buffers else True
        stats[2] = 0.0 if bool(finite) else 1.0
        dist.all_reduce(stats)
        loss = float(stats[0] / stats[1])
        if stats[2] > 0 or not torch.isfinite(stats[0]):
            return StepResult(loss=loss, grad_norm=None, skipped=True)
        wd = self.cfg.training.weight_decay
        for group in self.optimizer.param_groups:
            if isinstance(group.get("lr"), torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
            group["weight_decay"] = wd * group.get("wd_mult", 1.0)
        _, grad_norm, _ = self.optimizer.step()
        return StepResult(loss=loss, grad_norm=None if grad_norm is None else float(grad_norm), skipped=False)

    @torch.no_grad()
    def eval_loss(self, micro_batches: list[dict]) -> float:
        reports = self._run(micro_batches, forward_only=True)
        stats = torch.zeros(2, dtype=torch.float64, device=self.device)
        if self.is_last_stage:
            for r in reports:
                stats += r["lm loss"].double()
        dist.all_reduce(stats)
        return float(stats[0] / stats[1])

    # ------------------------------------------------------------------------ checkpoint
    def _sharded_state_dict(self, *, is_loading: bool) -> dict:
        model_sd = self.model.sharded_state_dict(metadata=dict(CKPT_METADATA))
        opt_sd = self.optimizer.sharded_state_dict(
            model_sd, is_loading=is_loading, metadata=dict(CKPT_METADATA)
        )
        return {"model": model_sd, "optimizer": opt_sd}

    def save(self, tmp: Path, finalize) -> None:
        from megatron.core import dist_checkpointing, parallel_state
        from megatron.core.dist_checkpointing.strategies.fully_parallel import (
            FullyParallelSaveStrategyWrapper,
        )
        from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

        # The RNG files are written after dist_checkpointing.save has looked at the (empty) directory:
        # a non-empty one makes it warn "Overwriting old incomplete / corrupted checkpoint".
        strategy = FullyParallelSaveStrategyWrapper(
            TorchDistSaveShardedStrategy(), parallel_state.get_data_parallel_group(with_context_parallel=True)
        )
        state = self._sharded_state_dict(is_loading=False)
        if self.async_queue is None:
            dist_checkpointing.save(
                sharded_state_dict=state,
                checkpoint_dir=str(tmp),
                sharded_strategy=strategy,
                content_metadata=dict(CKPT_METADATA),
            )
            save_rng_state(tmp, self.env.rank)
            finalize()
            return
        request = dist_checkpointing.save(
            sharded_state_dict=state,
            checkpoint_dir=str(tmp),
            sharded_strategy=strategy,
            content_metadata=dict(CKPT_METADATA),
            async_sharded_save=True,
            async_strategy="mcore",
        )
        save_rng_state(tmp, self.env.rank)
        request.finalize_fns.append(finalize)
        self.async_queue.schedule_async_request(request)

    def poll_saves(self, blocking: bool = False) -> None:
        if self.async_queue is not None:
            self.async_queue.maybe_finalize_async_calls(blocking=blocking)

    def _materialize_optimizer_state(self) -> None:
        """Create the Adam state (step, m, v) before loading: megatron's DistributedOptimizer.state_dict()
        needs it with torch's Adam (lazily created at the first step). Uses megatron's own dummy step
        with lr 0 (zero gradients, so m = v = 0 and the weights do not move); the load overwrites it all."""
        for opt in _inner_optimizers(self.optimizer):
            inner = getattr(opt, "optimizer", None)
            if (
                inner is None
                or not hasattr(opt, "_init_optimizer_states_with_dummy_values")
                or len(inner.state)
            ):
                continue
            saved = [g["lr"] for g in inner.param_groups]
            for g in inner.param_groups:
                g["lr"] = 0.0
            opt._init_optimizer_states_with_dummy_values()
            for g, lr in zip(inner.param_groups, saved):
                g["lr"] = lr

    def _restore_adam_step(self, applied_updates: int) -> None:
        """Set torch Adam's per-parameter ``step`` (its bias correction) to the number of applied updates.

        With torch's Adam (no TE/Apex), megatron-core 0.19.2 restores ``step`` from the param groups
        of the state built for loading, i.e. the dummy step above (1), not the checkpoint's (seen on
        the H200: m, v and the weights matched, ``step`` was 1). Every applied update is one
        ``optimizer.step()`` (skipped non-finite steps call none), so the count is known exactly.
        TE's FusedAdam keeps ``step`` in its param groups, which megatron restores itself.
        """
        for opt in _inner_optimizers(self.optimizer):
            inner = getattr(opt, "optimizer", None)
            if isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
                for st in inner.state.values():
                    if "step" in st:
                        st["step"] = torch.full_like(st["step"], float(applied_updates))

    def load(self, ckpt: Path, *, applied_updates: int, saved_world_size: int | None) -> None:
        """Model and optimizer (resharded over data-parallel ranks), Adam's ``step`` from
        ``applied_updates``, and this rank's RNG states when ``saved_world_size`` is this world size.

        Raises:
            DamagedCheckpointError: the RNG file does not deserialize (nothing changed yet), or
                ``dist_checkpointing.load`` fails (the model may be partly overwritten: load another
                checkpoint, which overwrites all of it, or stop).
            UnsafeCheckpointError: ``.metadata`` or a ShardedObject would unpickle something other
                than data (``training/torch_dist_vetting.py``: found by the vetting, nothing changed
                yet; or refused during the load, which reads as data too), or a Transformer Engine
                extra state something other than FP8 scaling state
                (``te_extra_state.UnsafeExtraStateError``; the model may be partly overwritten, as
                above).
            torch.OutOfMemoryError, RuntimeError: the GPU ran out of memory during the load (also
                when torch DCP gathered it from a rank: ``torch_dist_vetting.dist_load_error``), not
                taken for damage.
        """
        from megatron.core import dist_checkpointing

        # torch DCP unpickles .metadata and every ShardedObject without restriction: both are read
        # as data first (an allow-list unpickler; torch.load(weights_only=True) on the meta device)
        metadata = vet_torch_dist_checkpoint(ckpt)

        check_tensor_shapes(
            ckpt,
            tensor_shapes(metadata),
            sharded_tensor_shapes(self.model.sharded_state_dict(metadata=dict(CKPT_METADATA))),
        )
        rng = rng_file(ckpt, self.env.rank)
        same_world = rng.is_file() and saved_world_size == self.env.world_size
        rng_saved = load_weights_only(rng) if same_world else None
        self._materialize_optimizer_state()
        try:
            with data_only_torch_load():  # the load reads as data too (torch_dist_vetting)
                state = dist_checkpointing.load(
                    sharded_state_dict=self._sharded_state_dict(is_loading=True), checkpoint_dir=str(ckpt)
                )
        except (KeyboardInterrupt, SystemExit):
            raise
        # torch DCP gathers every rank's read errors into a CheckpointException, a BaseException
        except BaseException as err:  # noqa: BLE001
            raise dist_load_error(ckpt, err) from None
        # TE FP8 modules with delayed scaling keep their scales in a pickled extra state: vetted here
        # (an allow-list unpickler) before TE may unpickle it (training/te_extra_state.py)
        with allow_vetted_te_extra_state(state["model"]):
            self.model.load_state_dict(state["model"], strict=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self._restore_adam_step(applied_updates)
        if rng_saved is not None:
            restore_rng_state(rng_saved)
        else:
            self.log(
                f"resume: RNG states not restored (saved with world size {saved_world_size}, now "
                f"{self.env.world_size}); the model draws no random numbers while training (dropout 0)"
            )

    # ------------------------------------------------------------------------------ misc
    def params_finite(self) -> bool:
        flags = [torch.isfinite(p).all() for p in self.model.parameters()]
        ok = (
            torch.stack(flags).all().to(torch.int32).view(1)
            if flags
            else torch.ones(1, dtype=torch.int32, device=self.device)
        )
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        return bool(ok.item())

    def peak_mem_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated(self.device) / 1024**3

    def all_reduce_max(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def barrier(self) -> None:
        dist.barrier()
