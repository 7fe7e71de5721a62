"""megatron-core on a machine without a GPU: the one place that works around its CUDA assumptions.

megatron-core (0.16-0.19) assumes CUDA in two places that a CPU model build/forward/backward reaches:

1. ``torch.cuda.current_device()`` names the device of freshly made tensors: ``RotaryEmbedding.get_emb``
   moves its inverse frequencies there on the first forward, ``GlobalMemoryBuffer`` (used by the local
   ``DotProductAttention``) allocates its scratch there. Without a GPU the call raises. We make it
   answer ``"cpu"``, which every ``device=`` / ``.to(device=...)`` call site accepts.
2. The model-parallel RNG tracker (``tensor_parallel.get_cuda_rng_tracker()``) saves and restores the
   CUDA generator in ``fork()``; the local ``DotProductAttention`` always forks it (dropout), and so do
   the embedding and the block under sequence parallelism. We install megatron-core's own no-op
   tracker (the one it uses for inference: ``add``/``fork`` do nothing), so dropout, if any, draws
   from the default CPU generator. Our Llama configs use dropout 0, so no random numbers are drawn.

Weights are initialised on CPU through megatron-core's ``use_cpu_initialization=True`` path (the
builder sets it when there is no GPU), which needs no shim.

Not covered, deliberately (see shared/spec/megatron-core-notes.md): megatron-core
``DistributedDataParallel.finish_grad_sync``, ``get_megatron_optimizer`` and ``dist_checkpointing``
also call CUDA; the CPU training path of the trainer must route around them itself.

Use only when ``torch.cuda.is_available()`` is False; it is reversible::

    with cpu_compat.patched():          # no-op when a GPU exists
        model = build_gpt_model(cfg)
        loss = model(...).sum(); loss.backward()

or ``cpu_compat.install()`` / ``cpu_compat.uninstall()`` for a whole process (e.g. a pytest fixture).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["install", "installed", "needed", "patched", "uninstall"]

_saved: dict | None = None


def needed() -> bool:
    """True when there is no usable CUDA device (the only case where this module does anything)."""
    return not torch.cuda.is_available()


def installed() -> bool:
    return _saved is not None


def _cpu_current_device() -> str:
    return "cpu"


def install() -> bool:
    """Install the CPU shims if no GPU exists. Returns whether anything was installed.

    Idempotent. On a machine with a GPU it does nothing, so the GPU path stays megatron-core's own.
    """
    global _saved
    if not needed() or _saved is not None:
        return False
    from megatron.core.tensor_parallel import random as mcore_random

    _saved = {
        "current_device": torch.cuda.current_device,
        "tracker": mcore_random._CUDA_RNG_STATE_TRACKER,
        "tracker_initialized": mcore_random._CUDA_RNG_STATE_TRACKER_INITIALIZED,
    }
    torch.cuda.current_device = _cpu_current_device
    # megatron-core's public initializer; the "inference" tracker's add/fork are no-ops.
    mcore_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    return True


def uninstall() -> None:
    """Restore ``torch.cuda.current_device`` and megatron-core's previous RNG tracker."""
    global _saved
    if _saved is None:
        return
    from megatron.core.tensor_parallel import random as mcore_random

    torch.cuda.current_device = _saved["current_device"]
    mcore_random._CUDA_RNG_STATE_TRACKER = _saved["tracker"]
    mcore_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = _saved["tracker_initialized"]
    _saved = None


@contextlib.contextmanager
def patched() -> Iterator[bool]:
    """Context manager form of :func:`install` / :func:`uninstall`; yields whether it installed."""
    did = install()
    try:
        yield did
    finally:
        if did:
            uninstall()
