"""Fixtures for the megatron-core model tests.

megatron-core needs ``torch.distributed`` and ``initialize_model_parallel`` even for one process:
``mcore`` sets up a single-process gloo group with TP = PP = CP = 1 for this package, installs
``llama.cpu_compat`` when there is no GPU (on a GPU it seeds megatron's CUDA RNG tracker instead,
which GPU weight init needs), and tears everything down after the last test of the package.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from llama import cpu_compat
from training.distenv import free_local_port


@pytest.fixture(scope="package")
def mcore():
    from megatron.core import parallel_state, tensor_parallel

    created = not dist.is_initialized()
    if created:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_local_port()}", rank=0, world_size=1
        )
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    installed = cpu_compat.install()
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
    try:
        yield parallel_state
    finally:
        if installed:
            cpu_compat.uninstall()
        parallel_state.destroy_model_parallel()
        if created:
            dist.destroy_process_group()


def device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def tokens(b: int, s: int, vocab: int, *, seed: int = 0, dev=None):
    """input_ids, position_ids, labels for a [b, s] batch."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (b, s + 1), generator=g)
    dev = dev or device()
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    return ids[:, :-1].to(dev), pos.to(dev), ids[:, 1:].to(dev)


def causal_mask(s: int, dev=None) -> torch.Tensor:
    """megatron-core's causal mask: boolean [1, 1, s, s], True = masked."""
    return torch.triu(torch.ones(s, s, dtype=torch.bool, device=dev or device()), diagonal=1)[None, None]
