"""Process-group set-up from torchrun or Slurm variables, and megatron-core's model-parallel state.

Ranks: :func:`training.ranks.ranks_from_env` (``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``, else
``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID``, else a single process). The rendezvous is
``MASTER_ADDR``/``MASTER_PORT`` (torchrun sets them; under plain srun the launcher must export them,
e.g. from ``scontrol show hostnames``). A single process without them gets a local TCP rendezvous on
a free port. Backend: NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .ranks import ranks_from_env

__all__ = ["DistEnv", "all_gather_objects", "init_distributed", "shutdown"]


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    created_group: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that was free when asked (the OS picks it; a single-process group's
    rendezvous, and the tests' process groups, which run in parallel under pytest -n)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(*, use_cuda: bool) -> DistEnv:
    """Initialize torch.distributed (if not already) and pick this rank's device."""
    rank, world, local = ranks_from_env()
    if use_cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    created = False
    if not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            init = "env://"
        elif world == 1:
            init = f"tcp://127.0.0.1:{free_local_port()}"
        else:
            raise ValueError(
                f"{world} processes but MASTER_ADDR/MASTER_PORT are not set: launch with torchrun, "
                "or export them (the first host of the job and a free port)"
            )
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
        created = True
    return DistEnv(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local,
        device=device,
        created_group=created,
    )


def all_gather_objects(obj, env: DistEnv) -> list:
    """``obj`` of every rank, in rank order (picklable objects: messages, small dicts); every rank
    must call it. One process: ``[obj]`` without a collective."""
    if env.world_size == 1:
        return [obj]
    out = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def init_model_parallel(parallel, *, seed: int, use_cuda: bool) -> None:
    """megatron-core's ``initialize_model_parallel`` with the config's sizes, and its CUDA RNG tracker."""
    from megatron.core import parallel_state, tensor_parallel

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tensor,
        pipeline_model_parallel_size=parallel.pipeline,
        context_parallel_size=parallel.context,
    )
    if use_cuda:
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def shutdown(env: DistEnv) -> None:
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if env.created_group and dist.is_initialized():
        dist.destroy_process_group()
