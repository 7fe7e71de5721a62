"""tests/numerics/test_non_finite.py on the GPU backends: a NaN/Inf in Q, K or V poisons exactly its
scaling unit (table in ``tests/numerics/nonfinite.py``), and every other output entry equals the
backend's own clean run bit for bit."""

from __future__ import annotations

import pytest
import torch

import fp4_attention as fa
from tests.numerics.nonfinite import inputs, poison, poisoned_mask

from ..conftest import have_module

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

CASES = [("triton", r) for r in fa.backend_spec("triton").recipes] + [
    ("cute", r) for r in fa.backend_spec("cute").recipes
]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("tensor", ["q", "k", "v"])
@pytest.mark.parametrize("backend, recipe", CASES)
def test_non_finite_input_poisons_its_unit_gpu(backend, recipe, tensor, value):
    if backend == "cute" and not have_module("cutlass.cute"):
        pytest.skip("the cute backend needs the CUTLASS DSL (pip install '.[cute]')")
    q, k, v = (t.cuda() for t in inputs())
    kw = dict(recipe=recipe, causal=True, layout="bhsd", backend=backend)
    clean = fa.attention(q, k, v, **kw).cpu()
    out = fa.attention(*poison(q, k, v, tensor, value), **kw).cpu()
    if recipe == "bf16":
        assert torch.equal(out[0, 0], clean[0, 0])
        return
    mask = poisoned_mask(recipe, tensor)
    assert torch.equal(out.isnan(), mask), f"NaN at {(out.isnan() ^ mask).nonzero()[:5].tolist()} ..."
    assert torch.equal(out[~mask], clean[~mask])
