"""tools/fidelity.py's ``kbias=X`` family: four channels of K shifted by +-X for every token and head,
Q and V as ``normal``'s, so that exact attention is ``normal``'s up to the BF16 rounding of K (a shift
of K along fixed channels moves each query's scores by a constant)."""

import torch

from fp4_attention.numerics.exact import naive_attention
from tools.fidelity import make_inputs


def test_kbias_shifts_four_channels_of_k_only():
    q0, k0, v0 = make_inputs("normal", 1, 4, 2, 128, 64, seed=3)
    q, k, v = make_inputs("kbias=8", 1, 4, 2, 128, 64, seed=3)
    assert torch.equal(q, q0) and torch.equal(v, v0)
    shift = (k.float() - k0.float()).mean(dim=(0, 1, 2))  # per channel, over tokens and heads
    moved = shift.abs() > 1.0
    assert int(moved.sum()) == 4
    assert torch.allclose(shift[moved].abs(), torch.full((4,), 8.0), atol=0.05)
    # the same channels and signs for every token and head
    delta = (k.float() - k0.float())[..., moved]
    assert torch.allclose(delta, delta[:1, :1, :1].expand_as(delta), atol=0.07)  # BF16 steps of 1/16 at 8-16
    # softmax ignores a per-row constant: exact attention barely moves (only K's BF16 rounding)
    a, _ = naive_attention(q0.double(), k0.double(), v0.double(), causal=True, softmax_scale=64**-0.5)
    b, _ = naive_attention(q.double(), k.double(), v.double(), causal=True, softmax_scale=64**-0.5)
    assert float((a - b).norm() / a.norm()) < 0.02
