"""The saved state's way through autograd: flattened into ``save_for_backward`` and restored with
every field as it was, and no tensor made for the LSE's gradient (it has none)."""

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

import fp4_attention as fa
from fp4_attention import backends
from fp4_attention.backends import SavedState, flatten_state, restore_state
from fp4_attention.numerics.quant import FP8Tensor, MXFP4Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from interface_overhead import NAME, NullBackend, measure  # noqa: E402

from ..dispatch_ops import FILL_OPS, OpNames  # noqa: E402


@dataclass(frozen=True)
class _Extra:
    block: int  # an int field: a tensor index of the skeleton must not be confused with it
    note: str
    t: torch.Tensor
    missing: torch.Tensor | None = None


def test_flatten_restore_keeps_every_field():
    t = [torch.full((2,), float(i)) for i in range(6)]
    state = SavedState(
        q=FP8Tensor(data=t[0], scale=t[1]),
        k=MXFP4Tensor(payload=t[2], block_scale=t[3], paper_convention=True),
        v=_Extra(block=1, note="x", t=t[4]),
        out=t[5],
        lse=t[0],
    )
    skeleton, tensors = flatten_state(state)
    assert len(tensors) == 7 and all(isinstance(x, torch.Tensor) for x in tensors)
    back = restore_state(skeleton, tuple(tensors))  # autograd hands saved_tensors back as a tuple
    assert type(back.q) is FP8Tensor and back.q.data is t[0] and back.q.scale is t[1]
    assert type(back.k) is MXFP4Tensor and back.k.paper_convention is True and back.k.block_scale is t[3]
    # the int field stays 1 (it was replaced by the second saved tensor before)
    assert back.v.block == 1 and back.v.note == "x" and back.v.t is t[4] and back.v.missing is None
    assert back.out is t[5] and back.lse is t[0]


def test_backward_makes_no_tensor_for_the_lse_gradient():
    """The LSE is non-differentiable: autograd is told not to materialize a zero gradient for it,
    which on a GPU is a fill kernel in every backward. With the null backend of
    ``bench/interface_overhead.py`` the backward dispatches no op that makes a tensor of zeros."""
    fa.register_backend(NullBackend("cpu", 1, 4, 2, 16, 128), replace=True)
    try:
        _backward_ops_are_not_fills()
    finally:
        backends._SPECS.pop(NAME)
        backends._INSTANCES.pop(NAME)


def _backward_ops_are_not_fills():
    q = torch.zeros(1, 16, 4, 128, dtype=torch.bfloat16, requires_grad=True)
    k = torch.zeros(1, 16, 2, 128, dtype=torch.bfloat16, requires_grad=True)
    v = torch.zeros(1, 16, 2, 128, dtype=torch.bfloat16, requires_grad=True)
    out = fa.attention(q, k, v, recipe="fp8", causal=True, backend=NAME)
    with OpNames() as ops:
        out.backward(torch.ones_like(out))
    assert q.grad is not None and q.grad.shape == q.shape
    assert not [op for op in ops.names if op in FILL_OPS], ops.names


def test_interface_overhead_bench_runs():
    res = measure("cpu", (1, 4, 2, 16), steps=3)
    assert res["interface_us"] > 0 and res["bare_autograd_us"] > 0
    assert res["interface_own_us"] == res["interface_us"] - res["bare_autograd_us"]
