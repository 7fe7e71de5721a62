"""A torch tensor as a CuTe kernel argument, on a GPU or, for compiling without one, on a CPU.

:func:`cute_operand` is the one conversion of a torch tensor into a kernel argument, used by the
backend's compile functions (``backend._compiled``, ``backend._compiled_bwd``): a CUDA tensor goes
through flash-attn-4's ``to_cute_tensor`` (as always), a CPU tensor becomes the descriptor of a CUDA
tensor of the same dtype and rank, which compiles to the same kernel (``prebuild.py`` compiles the
kernels on a CPU machine this way):

* the same layout types as ``to_cute_tensor`` gives: every extent dynamic (32-bit), every stride
  dynamic (64-bit) except the leading dim's 1, the alignment asked for;
* global memory, and the calling convention of a CUDA tensor: device type CUDA, and FP8 passed as
  its ``uint8`` storage with the E4M3 / E5M2 element type (``to_cute_tensor`` exports FP8 through a
  ``uint8`` view, and the backend calls the kernels with ``uint8`` views), so a kernel compiled on a
  CPU accepts the same arguments as one compiled on the GPU.

The calling-convention part sets a private attribute of the DSL's fake tensor (``_tvm_ffi_tensor``;
see ``prebuild.py`` for the version check that guards it).
"""

from __future__ import annotations

import types

import torch

__all__ = ["cute_operand"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def cute_operand(t: torch.Tensor, leading_dim: int = -1, assumed_align: int = 16, *, device: str = "cuda"):
    """The CuTe kernel argument for ``t``: ``to_cute_tensor(t, assumed_align, leading_dim)`` for a CUDA
    tensor; for a CPU tensor, the descriptor of a CUDA tensor of its dtype and rank (module docstring;
    ``device="cpu"``: of a CPU tensor, to compare with ``to_cute_tensor`` on one).

    Args:
        t: any ``torch.Tensor`` of BF16, FP32, E4M3, E5M2, uint8 or int32; only its dtype and rank
            are read when it is not on a GPU.
        leading_dim: the dim of stride 1 (negative counts from the end).
        assumed_align: bytes the data pointer is assumed to be aligned to.
    Raises:
        ValueError: a dtype outside those.
    """
    from flash_attn.cute.cute_dsl_utils import to_cute_tensor

    if t.is_cuda:
        return to_cute_tensor(t, assumed_align=assumed_align, leading_dim=leading_dim)
    return _descriptor(t.dtype, t.dim(), leading_dim % t.dim(), assumed_align, device)


def _descriptor(dtype: torch.dtype, ndim: int, leading: int, assumed_align: int, device: str):
    import cutlass
    import tvm_ffi
    from cutlass import cute
    from cutlass.base_dsl.enums import AddressSpace

    elements = {
        torch.float8_e4m3fn: cutlass.Float8E4M3FN,
        torch.float8_e5m2: cutlass.Float8E5M2,
        torch.bfloat16: cutlass.BFloat16,
        torch.float32: cutlass.Float32,
        torch.uint8: cutlass.Uint8,
        torch.int32: cutlass.Int32,
    }
    if dtype not in elements:
        raise ValueError(f"cute_operand: no kernel argument of dtype {dtype}; use one of {list(elements)}")
    shape = tuple(cute.sym_int() for _ in range(ndim))
    stride = tuple(1 if i == leading else cute.sym_int64() for i in range(ndim))
    memspace = AddressSpace.gmem if device == "cuda" else AddressSpace.generic
    desc = cute.runtime.make_fake_tensor(
        elements[dtype], shape, stride, memspace=memspace, assumed_align=assumed_align
    )
    storage = "uint8" if dtype in _FP8 else str(dtype).removeprefix("torch.")
    desc._tvm_ffi_tensor = types.SimpleNamespace(
        dtype=tvm_ffi.dtype(storage), device=tvm_ffi.device(device, 0)
    )
    return desc
