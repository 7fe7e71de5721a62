"""What the trainer needs from an engine, and the pieces both engines share.

An engine owns the model, the optimizer and the engine-specific checkpoint files; the trainer owns
the loop, the schedule, data, logging, signals and the checkpoint directory protocol, with its own
files in it (``config.json``, ``trainer_state.json``), which engines do not read: what an engine
needs from them comes as arguments of ``load``. Two engines:

* ``engine_megatron.MegatronEngine`` (CUDA; the real one): megatron-core DDP + distributed
  optimizer + ``forward_backward_func`` + ``dist_checkpointing`` (torch_dist).
* ``engine_cpu.CPUEngine`` (no GPU): the same megatron-core model (``llama.cpu_compat``), torch
  AdamW on FP32 main weights, our own micro-batch accumulation into an FP32 gradient buffer, gloo
  all-reduce for data parallelism, ``torch.save`` checkpoints. megatron-core's DDP, optimizer and
  dist_checkpointing need CUDA (shared/spec/megatron-core-notes.md), hence this second route.

Interface (duck-typed)::

    engine.describe: str                         # which optimizer implementation, etc. (logged)
    engine.model: torch.nn.Module                # the unwrapped GPTModel (telemetry hooks)
    engine.train_step(micro_batches, *, lr, inject_nan=False) -> StepResult
    engine.eval_loss(micro_batches) -> float     # token-weighted mean over all data-parallel ranks
    engine.save(tmp_dir, finalize)               # all ranks; calls finalize() (all ranks) when written
    engine.load(ckpt_dir, *, applied_updates, saved_world_size)  # all ranks; see below
    engine.poll_saves(blocking=False)            # async saves: run pending finalizations
    engine.params_finite() -> bool               # global
    engine.peak_mem_gib() -> float | None
    engine.all_reduce_max(int) -> int
    engine.barrier()

``load``'s arguments, from the checkpoint's trainer state: ``applied_updates``, the optimizer
updates applied up to it (steps minus skipped non-finite steps; the GPU engine restores torch Adam's
``step`` from it), and ``saved_world_size``, the world size that saved it (None if unknown; the GPU
engine restores the per-rank RNG states only at the same size). A checkpoint file that does not
deserialize raises :class:`training.checkpoint.DamagedCheckpointError` (naming the file; the
trainer then falls back to the previous checkpoint); files are only ever loaded with
``weights_only=True`` (:func:`load_weights_only`).

Loss: each micro-batch's loss is its token-mean (``sum(loss * mask) / sum(mask)``); the step loss
and the gradient are the mean over the micro-batches and data-parallel ranks (megatron-core's
default, ``calculate_per_token_loss=False``). A step whose loss or gradients are not finite on any
rank is not applied (``StepResult.skipped``).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .checkpoint import ConfigMismatchError, DamagedCheckpointError, rng_file

__all__ = [
    "StepResult",
    "check_tensor_shapes",
    "describe_load_error",
    "gathered_failures",
    "load_weights_only",
    "restore_rng_state",
    "rng_state",
    "save_rng_state",
]


@dataclass(frozen=True)
class StepResult:
    loss: float
    grad_norm: float | None
    skipped: bool


def describe_load_error(err: BaseException) -> str:
    """``Type: first sentence`` of a deserialization error, without torch's advice to retry with
    ``weights_only=False`` (which would run code from the file): only the type when the sentence
    mentions ``weights_only``."""
    first = str(err).strip().split("\n")[0].split(". ")[0].rstrip(".")
    if not first or "weights_only" in first:
        return type(err).__name__
    return f"{type(err).__name__}: {first[:200]}"


def gathered_failures(err: BaseException) -> list:
    """The per-rank errors torch DCP gathered into ``err`` (a ``CheckpointException``: ``failures``
    maps a rank to an exception or an (exception, traceback) pair), each without its traceback; an
    empty list for any other exception."""
    failures = getattr(err, "failures", None)
    if not isinstance(failures, dict):
        return []
    return [f[0] if isinstance(f, tuple) and f else f for f in failures.values()]


def load_weights_only(path: Path):
    """``torch.load(path, map_location="cpu", weights_only=True)``.

    Raises:
        DamagedCheckpointError: the file is missing or does not deserialize (names the file).
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError, RuntimeError (zip reader), UnicodeDecodeError, OSError, ...
        raise DamagedCheckpointError(
            f"{path} does not deserialize as a weights-only torch file ({describe_load_error(err)})"
        ) from None


def check_tensor_shapes(
    ckpt: Path, saved: dict[str, tuple[int, ...]], model: dict[str, tuple[int, ...]]
) -> None:
    """Refuse to load a checkpoint whose tensors have other shapes than the model's.

    A change of model shape (``model.hidden_size``, heads, ``ffn_hidden_size``, ``vocab_size``, ...)
    that ``checkpoint.allow_config_change`` lets past the config comparison still cannot load into
    the new model; this says so before any tensor is copied. Keys present on one side only are the
    caller's to report; ``*_extra_state`` entries (bytes of varying size) are not compared.

    Args:
        ckpt: the checkpoint directory (for the message).
        saved: tensor name -> shape, as stored in the checkpoint (global shapes for a sharded one).
        model: tensor name -> shape, as the model built from this config has them.

    Raises:
        ConfigMismatchError: a shape differs; the message names the first tensor, both shapes,
            how many more differ, and what to do.
    """
    diffs = [
        (k, tuple(saved[k]), tuple(shape))
        for k, shape in model.items()
        if k in saved and not k.endswith("_extra_state") and tuple(saved[k]) != tuple(shape)
    ]
    if not diffs:
        return
    key, old, new = diffs[0]
    more = f", and {len(diffs) - 1} more tensor(s)" if len(diffs) > 1 else ""

    def fmt(shape):
        return "x".join(map(str, shape)) or "scalar"

    raise ConfigMismatchError(
        f"cannot resume from {ckpt}: its weights do not fit the model of this config ({key} is "
        f"{fmt(old)} in the checkpoint, {fmt(new)} now{more}); a change of model shape cannot continue "
        "from a checkpoint: undo it, or start a fresh run in another runtime.output_dir or checkpoint.dir"
    )


def rng_state() -> dict:
    """Python, numpy, torch (and CUDA, megatron's CUDA tracker) RNG states, as weights_only-loadable data."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": np_state[0],
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        from megatron.core import tensor_parallel

        state["cuda"] = torch.cuda.get_rng_state()
        state["tracker"] = tensor_parallel.get_cuda_rng_tracker().get_states()
    return state


def save_rng_state(ckpt_dir: Path, rank: int) -> None:
    """This rank's :func:`rng_state` into ``ckpt_dir`` (:func:`training.checkpoint.rng_file`), fsynced."""
    path = rng_file(ckpt_dir, rank)
    path.parent.mkdir(exist_ok=True)
    with open(path, "wb") as f:
        torch.save(rng_state(), f)
        f.flush()
        os.fsync(f.fileno())


def restore_rng_state(state: dict) -> None:
    random.setstate(python_rng_state_to_tuple(state["python"]))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and "cuda" in state:
        from megatron.core import tensor_parallel

        torch.cuda.set_rng_state(state["cuda"])
        tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def python_rng_state_to_tuple(state):
    """random.setstate needs tuples; a weights_only load may give lists."""
    if isinstance(state, list):
        return tuple(python_rng_state_to_tuple(s) for s in state)
    return state
