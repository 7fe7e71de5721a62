"""A NaN or Inf in Q, K or V poisons its scaling unit and nothing else, in every recipe (no error
is raised; the Direct-P recipes used to raise ValueError from the E2M1 encoder). Table in
``nonfinite.py``."""

from __future__ import annotations

import pytest
import torch

import fp4_attention as fa
from tests.numerics.nonfinite import inputs, poison, poisoned_mask


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("tensor", ["q", "k", "v"])
@pytest.mark.parametrize("recipe", list(fa.RECIPES))
def test_non_finite_input_poisons_its_unit(recipe, tensor, value):
    q, k, v = inputs()
    clean = fa.attention(q, k, v, recipe=recipe, causal=True, layout="bhsd", backend="reference")
    out = fa.attention(
        *poison(q, k, v, tensor, value), recipe=recipe, causal=True, layout="bhsd", backend="reference"
    )
    if recipe == "bf16":
        assert torch.equal(out[0, 0], clean[0, 0])
        return
    mask = poisoned_mask(recipe, tensor)
    assert torch.equal(out.isnan(), mask)
    assert torch.equal(out[~mask], clean[~mask])
