"""One key holding almost all of each row's mass (an attention sink): the training recipes'
gradients against float64, swept over the logit gap (bound and measurements in ``dominant.py``).

The failure this guards against: D = rowsum(dO * O) taken from the BF16 output while dP reads the
FP8 V, so that dP - D does not cancel on the dominant key (dQ norm ~2 where the exact one is ~1e-8).
"""

from __future__ import annotations

import pytest

import fp4_attention as fa
from tests.numerics.dominant import bound_violations, dequantized_operands, dominant_inputs, exact_grads

RECIPES = ("bf16", "fp8", "nvfp4qk_fp8pv")
# (S, Hq, Hkv, causal): several lengths (a ragged last KV tile included), GQA 1 and 6, both masks
SHAPES = [(136, 4, 4, True), (300, 6, 1, True), (257, 4, 1, False)]


def _grads(q, k, v, dout, recipe, causal, backend="reference", device="cpu"):
    qq, kk, vv = (t.detach().clone().to(device).requires_grad_() for t in (q, k, v))
    out = fa.attention(qq, kk, vv, recipe=recipe, causal=causal, layout="bhsd", backend=backend)
    out.backward(dout.to(device))
    return tuple(t.grad.cpu() for t in (qq, kk, vv))


@pytest.mark.parametrize("gap", [5, 10, 20, 30, 40])
@pytest.mark.parametrize("s, hq, hkv, causal", SHAPES)
def test_dominant_key_gradients_reference(gap, s, hq, hkv, causal):
    q, k, v, dout = dominant_inputs(gap, 1, hq, hkv, s, 128)
    exact = {r: exact_grads(dequantized_operands(q, k, v, r), dout, causal) for r in RECIPES}
    grads = {r: _grads(q, k, v, dout, r, causal) for r in RECIPES}
    assert not bound_violations(grads, exact)
