"""Direct-P for E4M3 P: the FMA-only 2^x and its E4M3 rounding (contract §2 "Extensions")."""

import math

import pytest
import torch

from fp4_attention.numerics.direct_p_e4m3 import (
    exp2_fma,
    exp2_poly_coeffs,
    exponent_grid,
    p_e4m3_exact,
    p_e4m3_fma,
)
from fp4_attention.numerics.formats import round_e4m3

GRID = exponent_grid()  # x in [-12, log2 448] in steps of 2^-12


@pytest.mark.parametrize("degree", range(1, 7))
def test_polynomial_is_one_at_zero_and_two_at_one(degree):
    c = exp2_poly_coeffs(degree)
    assert len(c) == degree + 1 and c[0] == 1.0
    assert all(torch.tensor(v, dtype=torch.float32).item() == v for v in c)  # float32 values
    assert math.isclose(sum(c), 2.0, rel_tol=2**-22)


def test_degree_one_is_mitchell_and_bad_degrees_raise():
    assert exp2_poly_coeffs(1) == (1.0, 1.0)
    for bad in (0, 7, 2.5):
        with pytest.raises(ValueError, match="degree must be an int in 1..6"):
            exp2_poly_coeffs(bad)
    with pytest.raises(ValueError, match="float32"):
        exp2_fma(torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("degree", range(1, 7))
def test_powers_of_two_are_exact_and_codes_monotone(degree):
    k = torch.arange(-126, 9, dtype=torch.float32)
    assert torch.equal(exp2_fma(k, degree), torch.exp2(k))  # the lifted row max 2^8 among them
    p = p_e4m3_fma(GRID, degree)
    assert bool((p[1:] >= p[:-1]).all())
    assert p_e4m3_fma(torch.tensor([-torch.inf, -200.0, -11.0]), degree).tolist() == [0.0, 0.0, 0.0]
    # NaN and -inf clamp to 2^-126 (the kernel's max.f32 returns the non-NaN operand)
    assert exp2_fma(torch.tensor([torch.nan, -torch.inf]), degree).tolist() == [2.0**-126] * 2


@pytest.mark.parametrize(
    "degree, max_rel, max_mismatch", [(2, 3e-3, 0.02), (3, 1.2e-4, 1e-3), (4, 4e-6, 0.0), (5, 2e-7, 0.0)]
)
def test_error_and_e4m3_agreement_on_the_grid(degree, max_rel, max_mismatch):
    """Relative error of the FP32 2^x, and the share of E4M3 values that differ from the exact
    path's, on x in [-12, log2 448] in steps of 2^-12 (bench/direct_p_e4m3_numerics.py reports the
    same)."""
    approx = exp2_fma(GRID, degree).double()
    exact = torch.exp2(GRID.double())
    assert float(((approx - exact) / exact).abs().max()) < max_rel
    mismatch = float((round_e4m3(approx.float()) != p_e4m3_exact(GRID)).double().mean())
    assert mismatch <= max_mismatch
    if degree == 2:
        assert mismatch > 0  # the bound is not vacuous: degree 2 does flip codes
