"""training/out_of_memory.py: which exceptions mean the GPU ran out of memory, and the GPU engine's
load error built from them (torch_dist_vetting.dist_load_error), on torch DCP's own exception."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from training.checkpoint import DamagedCheckpointError, UnsafeCheckpointError
from training.out_of_memory import out_of_memory_error
from training.torch_dist_vetting import dist_load_error

ALLOCATOR = "CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 79.19 GiB"
# the texts of the errors raised outside the caching allocator (module docstring's sources)
OUTSIDE = [
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call",
    "NCCL error in: ProcessGroupNCCL.cpp:3699, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
    "NCCL version 2.27.3\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
    "Cuda failure 2 'out of memory'",
    "NCCL error: unhandled cuda error\nLast error:\nCuda failure 'out of memory'",
    "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
]
NOT_MEMORY = [
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    RuntimeError("NCCL error: unhandled cuda error\nLast error:\nCuda failure 1 'invalid argument'"),
    RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed."),
    ValueError("CUDA error: out of memory"),  # not a RuntimeError: a message, not CUDA's error
    KeyError("out of memory"),
]


def test_the_allocators_error_and_cudas_ncclss_cublass_are_out_of_memory():
    err = torch.OutOfMemoryError(ALLOCATOR)
    assert out_of_memory_error(err) is err
    for text in OUTSIDE:
        err = RuntimeError(text)
        assert out_of_memory_error(err) is err, text
    for err in NOT_MEMORY:
        assert out_of_memory_error(err) is None, err


def test_an_error_carried_in_a_cause_or_context_is_found():
    oom = RuntimeError(OUTSIDE[0])
    try:
        try:
            raise oom
        except RuntimeError:
            raise ValueError("checkpoint could not be read") from None  # context kept, cause None
    except ValueError as err:
        assert out_of_memory_error(err) is oom
    try:
        try:
            raise ValueError("inner")
        except ValueError as inner:
            raise DamagedCheckpointError("outer") from inner
    except DamagedCheckpointError as err:
        assert out_of_memory_error(err) is None


def _dcp_load_error(tmp_path, monkeypatch, raised: BaseException) -> BaseException:
    """The exception torch DCP's load gives when its storage reader raises ``raised``."""
    dcp.save({"w": torch.randn(4, 4)}, checkpoint_id=str(tmp_path), no_dist=True)

    def read_data(self, plan, planner):
        raise raised

    monkeypatch.setattr(FileSystemReader, "read_data", read_data)
    with pytest.raises(BaseException) as info:  # noqa: PT011 (CheckpointException is one)
        dcp.load({"w": torch.empty(4, 4)}, checkpoint_id=str(tmp_path), no_dist=True)
    return info.value


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_an_out_of_memory_load_in_torch_dcp_is_not_damage(tmp_path, monkeypatch):
    """torch DCP gathers a rank's read error into a CheckpointException (a BaseException): before
    dist_load_error, an out-of-memory load was raised as DamagedCheckpointError, and the trainer
    passed over the checkpoint for an older one."""
    oom = torch.OutOfMemoryError(ALLOCATOR)
    err = _dcp_load_error(tmp_path, monkeypatch, oom)
    assert type(err).__name__ == "CheckpointException" and not isinstance(err, Exception)
    assert out_of_memory_error(err) is oom
    assert dist_load_error(tmp_path, err) is oom


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dist_load_error_of_damage_and_of_a_refusal(tmp_path, monkeypatch):
    err = _dcp_load_error(tmp_path, monkeypatch, OSError("unexpected end of file"))
    out = dist_load_error(tmp_path, err)
    assert isinstance(out, DamagedCheckpointError)
    assert str(out).startswith(f"{tmp_path} cannot be loaded by megatron-core's dist_checkpointing.load (")
    refusal = UnsafeCheckpointError("'optimizer.step' is not data: GLOBAL posix.system")
    out = dist_load_error(tmp_path, refusal)
    assert isinstance(out, UnsafeCheckpointError) and "may run code when unpickled" in str(out)
