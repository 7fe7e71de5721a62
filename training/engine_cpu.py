"""The CPU engine: megatron-core's model, torch AdamW on FP32 main weights, gloo data parallelism.

Mirrors the GPU engine's numerics where it can: BF16 model parameters (``model.params_dtype``),
FP32 main weights owned by the optimizer, gradients accumulated over micro-batches in one FP32
buffer (as megatron-core DDP's ``main_grad`` with ``grad_reduce_in_fp32``), all-reduced (sum, then
divided) over data-parallel ranks with gloo, clipped by global L2 norm (megatron's
``clip_coeff = clip / (norm + 1e-6)``), then ``torch.optim.AdamW`` (foreach; the fused kernel is
CUDA-only) and a copy back into the BF16 parameters. Weight decay is 0 for 1-D parameters (norms),
as in megatron-core. Tensor/pipeline/context parallelism is not supported on CPU.

Checkpoint files (rank 0; data-parallel replicas are identical): ``model.pt`` (the model's
tensors), ``optimizer.pt`` (FP32 main weights and the AdamW state); every rank its RNG state.
All are plain tensors/containers, loaded with ``torch.load(weights_only=True)``
(:func:`training.engine.load_weights_only`).
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import rng_file
from .engine import StepResult, check_tensor_shapes, load_weights_only, restore_rng_state, save_rng_state

__all__ = ["CPUEngine", "batch_loss"]


def batch_loss(model, mb: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of per-token losses under the loss mask, number of tokens) of one micro-batch."""
    tokens = mb["tokens"].to(device, non_blocking=True)
    labels = mb["labels"].to(device, non_blocking=True)
    mask = mb["loss_mask"].to(device, non_blocking=True).float()
    position_ids = mb["position_ids"].to(device, non_blocking=True)
    losses = model(input_ids=tokens, position_ids=position_ids, attention_mask=None, labels=labels)
    return (losses.float() * mask).sum(), mask.sum()


def _shapes(state: dict) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def _save(obj, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class CPUEngine:
    def __init__(self, cfg, llama_cfg, env, *, log=print):
        from llama import build_gpt_model, cpu_compat

        par = cfg.parallel
        if par.model_parallel_size != 1:
            raise ValueError(
                "the CPU engine supports data parallelism only; set parallel.tensor=parallel.pipeline="
                "parallel.context=1 (or run on GPUs)"
            )
        cpu_compat.install()
        if cfg.checkpoint.async_save:
            log(
                "checkpoint: async_save applies to the megatron-core (GPU) engine only; the CPU engine saves "
                "synchronously"
            )
        self.env = env
        self.device = torch.device("cpu")
        self.dp = env.world_size
        self.clip_grad = cfg.training.clip_grad
        torch.manual_seed(cfg.training.seed)
        if cfg.training.use_cpu_initialization is False:
            raise ValueError(
                "training.use_cpu_initialization=false initialises on a GPU, and this CPU run has "
                "none; use null (the default) or true"
            )
        self.model = build_gpt_model(llama_cfg, parallel=par, use_cpu_initialization=True)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        numel = sum(p.numel() for p in self.params)
        self.grad_buf = torch.zeros(numel, dtype=torch.float32)
        self.main, self.views, offset = [], [], 0
        for p in self.params:
            self.main.append(
                p if p.dtype == torch.float32 else torch.nn.Parameter(p.detach().float().clone())
            )
            self.views.append(self.grad_buf[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        decay = [m for m in self.main if m.dim() > 1]
        no_decay = [m for m in self.main if m.dim() <= 1]
        t = cfg.training
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=t.lr,
            betas=(t.adam_beta1, t.adam_beta2),
            eps=t.adam_eps,
            foreach=True,
        )
        self.describe = (
            f"CPU engine: megatron-core GPTModel ({llama_cfg.params_dtype} params) + torch.optim.AdamW "
            f"(foreach) on FP32 main weights, FP32 gradient accumulation, gloo DP={self.dp} "
            "(megatron-core's DDP/distributed optimizer need CUDA)"
        )

    # --------------------------------------------------------------------------- step
    def train_step(self, micro_batches: list[dict], *, lr: float, inject_nan: bool = False) -> StepResult:
        self.grad_buf.zero_()
        n = len(micro_batches)
        loss_total = torch.zeros((), dtype=torch.float32)
        for mb in micro_batches:
            loss_sum, count = batch_loss(self.model, mb, self.device)
            if inject_nan:
                loss_sum = loss_sum * float("nan")
            loss = loss_sum / count
            (loss / n).backward()
            loss_total += loss.detach()
            for p, view in zip(self.params, self.views):
                if p.grad is not None:
                    view.add_(p.grad)
                    p.grad = None
        loss_total /= n
        if self.dp > 1:
            stats = torch.cat([self.grad_buf, loss_total.view(1)])
            dist.all_reduce(stats)
            stats /= self.dp
            self.grad_buf.copy_(stats[:-1])
            loss_total = stats[-1]
        grad_norm = float(torch.linalg.vector_norm(self.grad_buf))
        loss_value = float(loss_total)
        if not (torch.isfinite(torch.tensor(loss_value)) and torch.isfinite(torch.tensor(grad_norm))):
            return StepResult(loss=loss_value, grad_norm=None, skipped=True)
        if self.clip_grad > 0:
            coeff = self.clip_grad / (grad_norm + 1e-6)
            if coeff < 1.0:
                self.grad_buf.mul_(coeff)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        for main, view in zip(self.main, self.views):
            main.grad = view
        self.optimizer.step()
        with torch.no_grad():
            for p, main in zip(self.params, self.main):
                main.grad = None
                if main is not p:
                    p.copy_(main)
        return StepResult(loss=loss_value, grad_norm=grad_norm, skipped=False)

    @torch.no_grad()
    def eval_loss(self, micro_batches: list[dict]) -> float:
        stats = torch.zeros(2, dtype=torch.float64)
        for mb in micro_batches:
            loss_sum, count = batch_loss(self.model, mb, self.device)
            stats += torch.stack([loss_sum.double(), count.double()])
        if self.dp > 1:
            dist.all_reduce(stats)
        return float(stats[0] / stats[1])

    # ----------------------------------------------------------------------- checkpoint
    def save(self, tmp: Path, finalize) -> None:
        save_rng_state(tmp, self.env.rank)
        if self.env.is_main:
            state = {k: v for k, v in self.model.state_dict().items() if isinstance(v, torch.Tensor)}
            _save(state, tmp / "model.pt")
            _save(
                {"main": [m.detach() for m in self.main], "optimizer": self.optimizer.state_dict()},
                tmp / "optimizer.pt",
            )
        self.barrier()
        finalize()

    def load(self, ckpt: Path, *, applied_updates: int, saved_world_size: int | None) -> None:
        """Model, main weights, AdamW state (its ``step`` included, so ``applied_updates`` is not needed)
        and this rank's RNG states where the checkpoint has them (at any ``saved_world_size``).

        Raises:
            DamagedCheckpointError: a file does not deserialize (nothing has been changed then).
        """
        # every file is deserialized before anything is applied: a damaged one leaves the engine as it was
        state = load_weights_only(ckpt / "model.pt")
        check_tensor_shapes(ckpt, _shapes(state), _shapes(self.model.state_dict()))
        opt = load_weights_only(ckpt / "optimizer.pt")
        rng = rng_file(ckpt, self.env.rank)
        rng_saved = load_weights_only(rng) if rng.is_file() else None
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        bad = [k for k in list(missing) + list(unexpected) if not k.endswith("_extra_state")]
        if bad:
            raise ValueError(f"checkpoint {ckpt} does not match the model: keys {bad[:8]}")
        with torch.no_grad():
            for main, saved in zip(self.main, opt["main"], strict=True):
                main.copy_(saved)
            for p, main in zip(self.params, self.main):
                if main is not p:
                    p.copy_(main)
        self.optimizer.load_state_dict(opt["optimizer"])
        if rng_saved is not None:
            restore_rng_state(rng_saved)

    def poll_saves(self, blocking: bool = False) -> None:
        return None

    # ---------------------------------------------------------------------------- misc
    def params_finite(self) -> bool:
        ok = torch.tensor([all(bool(torch.isfinite(m).all()) for m in self.main)], dtype=torch.int32)
        if self.dp > 1:
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        return bool(ok.item())

    def peak_mem_gib(self) -> float | None:
        """Process max RSS (CPU has no allocator statistics comparable to CUDA's)."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2

    def all_reduce_max(self, value: int) -> int:
        if self.dp == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def barrier(self) -> None:
        if self.dp > 1:
            dist.barrier()
