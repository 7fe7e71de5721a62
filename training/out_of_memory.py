"""Which exceptions mean that the GPU ran out of memory, whatever raised them.

PyTorch's caching allocator raises ``torch.OutOfMemoryError``. Memory taken outside it fails
differently: a ``cudaMalloc`` of a library's own (cuBLAS's handle and workspace, a kernel's
launcher) raises ``RuntimeError: CUDA error: out of memory`` or ``CUDA error:
CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)```; NCCL's buffers raise a
``torch.distributed.DistBackendError`` (a ``RuntimeError``) whose text ends ``Last error: Cuda
failure 2 'out of memory'`` (``NCCL WARN Cuda failure 'out of memory'`` in NCCL's own log, e.g.
NVIDIA/nccl#1235). And torch's distributed checkpoint (megatron-core's ``dist_checkpointing.load``)
gathers each rank's read error into a ``CheckpointException`` (a ``BaseException``), so an
out-of-memory error during a checkpoint load arrives inside another exception, where it must not
be taken for a damaged file.

:func:`out_of_memory_error` finds such an error in an exception, its DCP failures and its
``__cause__`` / ``__context__`` chain; the trainer stops on it with exit code 6
(``training.signals.EXIT_OUT_OF_MEMORY``) and the memory advice of ``training.plan``.
"""

from __future__ import annotations

import re

import torch

from .engine import gathered_failures

__all__ = ["out_of_memory_error"]

# CUDA's runtime error text for cudaErrorMemoryAllocation ("CUDA error: out of memory"), NCCL's
# ("Cuda failure 2 'out of memory'", the number absent in older releases) and cuBLAS's allocation
# status; matched in a RuntimeError's text only (a ValueError saying "out of memory" is not one)
_MARKS = re.compile(
    r"CUDA error: out of memory|Cuda failure (\d+ )?'out of memory'|CUBLAS_STATUS_ALLOC_FAILED"
)


def _nested(err: BaseException) -> list[BaseException]:
    """The exceptions ``err`` carries: torch DCP's per-rank failures (``CheckpointException.failures``,
    rank -> exception or (exception, traceback)), its explicit cause and its context."""
    out = [f for f in gathered_failures(err) if isinstance(f, BaseException)]
    return out + [e for e in (err.__cause__, err.__context__) if e is not None]


def out_of_memory_error(err: BaseException) -> BaseException | None:
    """The GPU out-of-memory error that ``err`` is or carries, else None (module docstring).

    Args:
        err: any exception.
    Returns:
        ``err`` itself when it is a ``torch.OutOfMemoryError`` or a ``RuntimeError`` with CUDA's,
        NCCL's or cuBLAS's out-of-memory text (module docstring); else the first such error among the
        exceptions it carries (torch DCP's gathered failures, ``__cause__``, ``__context__``),
        searched depth first; else None.
    """
    seen, todo = set(), [err]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and _MARKS.search(str(e))):
            return e
        todo[:0] = _nested(e)
    return None
