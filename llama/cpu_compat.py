"""megatron-core on a machine without a GPU: the one place that works around its CUDA assumptions.

megatron-core (0.16-0.19) assumes CUDA in two places that a CPU model build/forward/backward reaches,
and CPUs without BF16 instructions make a third thing too slow to test:

1. ``torch.cuda.current_device()`` names the device of freshly made tensors: ``RotaryEmbedding.get_emb``
   moves its inverse frequencies there on the first forward, ``GlobalMemoryBuffer`` (used by the local
   ``DotProductAttention``) allocates its scratch there. Without a GPU the call raises. We make it
   answer ``"cpu"``, which every ``device=`` / ``.to(device=...)`` call site accepts.
2. The model-parallel RNG tracker (``tensor_parallel.get_cuda_rng_tracker()``) saves and restores the
   CUDA generator in ``fork()``; the local ``DotProductAttention`` always forks it (dropout), and so do
   the embedding and the block under sequence parallelism. We install megatron-core's own no-op
   tracker (the one it uses for inference: ``add``/``fork`` do nothing), so dropout, if any, draws
   from the default CPU generator. Our Llama configs use dropout 0, so no random numbers are drawn.

3. BF16 matrix products. megatron-core's linear layers call ``torch.matmul`` / ``Tensor.matmul`` on
   BF16 operands; on a CPU without AVX512-BF16 or AMX, torch runs them 10-20x slower than FP32 (a
   ``[512, 128] x [128, 128256]`` LM-head product: 8.6 s in BF16, 0.85 s in FP32, measured on a
   2-core AMD EPYC CI machine), which made one step of the default job take ~100 s. While installed,
   a product of two CPU BF16 tensors is computed in FP32 and rounded to BF16: the numerics of a BF16
   GEMM with FP32 accumulation (what cuBLAS and oneDNN's BF16 kernels compute), up to the order of
   the FP32 sums. Every other product goes to torch unchanged.

Weights are initialised on CPU through megatron-core's ``use_cpu_initialization=True`` path (the
builder sets it when there is no GPU), which needs no shim.

Not covered, deliberately (see shared/spec/megatron-core-notes.md): megatron-core
``DistributedDataParallel.finish_grad_sync``, ``get_megatron_optimizer`` and ``dist_checkpointing``
also call CUDA; the CPU training path of the trainer must route around them itself. Nor is
megatron-core's default causal mask: its local ``DotProductAttention`` called with
``attention_mask=None`` builds one with ``device="cuda"`` written out
(``transformer/utils.py:get_default_causal_mask``, 0.19.2; found in review, 2026-12-06), so on a CPU
pass it an explicit causal mask (True = masked), as the tests that compare against it do. Our
attention in the slot takes the mask type and needs none.

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
_torch_matmul = torch.matmul
_tensor_matmul = torch.Tensor.matmul


def _bf16_cpu(a, b) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype == torch.bfloat16
        and a.device.type == b.device.type == "cpu"
    )


def _matmul(a, b, *, out=None):
    """``torch.matmul`` with CPU BF16 operands computed in FP32 and rounded to BF16 (item 3 above)."""
    if out is None and _bf16_cpu(a, b):
        return _torch_matmul(a.float(), b.float()).to(torch.bfloat16)
    return _torch_matmul(a, b) if out is None else _torch_matmul(a, b, out=out)


def _tensor_matmul_fp32(self, other):
    if _bf16_cpu(self, other):
        return _torch_matmul(self.float(), other.float()).to(torch.bfloat16)
    return _tensor_matmul(self, other)


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
    torch.matmul = _matmul
    torch.Tensor.matmul = _tensor_matmul_fp32
    # megatron-core's public initializer; the "inference" tracker's add/fork are no-ops.
    mcore_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    return True


def uninstall() -> None:
    """Restore ``torch.cuda.current_device``, torch's matmul and megatron-core's previous RNG tracker."""
    global _saved
    if _saved is None:
        return
    from megatron.core.tensor_parallel import random as mcore_random

    torch.cuda.current_device = _saved["current_device"]
    torch.matmul = _torch_matmul
    torch.Tensor.matmul = _tensor_matmul
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
