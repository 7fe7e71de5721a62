"""Cosines of a recipe against float64 on one ``tools/fidelity.py`` input family at a CPU-test size
(B1 Hq4 Hkv1 S256 D128, causal), for the tests of recipe options (Q/K rotation, K scales per 64 keys)."""

import torch

import fp4_attention as fa
from fp4_attention.numerics.exact import naive_attention
from tools.fidelity import make_inputs

from ..conftest import cosine


def cosines_vs_float64(family: str, recipe, seed: int = 1, **options) -> tuple[float, float, float, float]:
    """(out, dQ, dK, dV) cosines of ``fa.attention(recipe=recipe, **options)`` (auto backend: the
    reference on the CPU) against float64 attention on the same BF16 inputs and dO."""
    q, k, v = make_inputs(family, 1, 4, 1, 256, 128, seed)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).bfloat16()
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    ref, _ = naive_attention(qd, kd, vd, causal=True, softmax_scale=128**-0.5)
    ref.backward(dout.double())
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    out = fa.attention(qq, kk, vv, recipe=recipe, causal=True, layout="bhsd", **options)
    out.backward(dout)
    return cosine(out, ref), cosine(qq.grad, qd.grad), cosine(kk.grad, kd.grad), cosine(vv.grad, vd.grad)
