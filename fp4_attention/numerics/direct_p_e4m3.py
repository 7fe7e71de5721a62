"""Direct-P for E4M3 P: ``2^x`` on the FMA units instead of the exp2 unit (contract §2 "Extensions").

The exp2 unit (MUFU.EX2) retires about 3.9 T results/s on the H200 (contract §2, "Extensions"),
16 per clock per SM, an eighth of the 128 FP32 FMAs per clock per SM. At head dim 128 a score
costs 4 * 128 FLOPs of MMA, so at the measured FP8 ceiling (1477 TFLOP/s, 2.9 T scores/s) the
exponentials take about 0.74 of the MMA time. Direct-P computes some of them with FP32 and
integer arithmetic, the way a kernel would:

    x  = max(x, -126)              FMNMX (keeps 2^floor(x) a normal FP32 number; E4M3 rounds
                                   anything below 2^-10 to 0; NaN gives -126, as PTX max.f32)
    t  = x + 1.5 * 2^23 (add.rm)   FADD rounding down: t's low mantissa bits hold floor(x)
    n  = t - 1.5 * 2^23            FADD: floor(x) as a float
    f  = x - n                     FADD, f in [0, 1] (1 only when x rounds up to 0 from below)
    p  = c_d f^d + ... + c_1 f + 1 ``degree`` FFMAs (Horner)
    2^x ~ p * 2^n                  SHL of t's bits by 23 (floor(x) << 23), IADD into p's bits
                                   (exact: the exponent field gains n)

then rounds to E4M3 as the exp2 unit's result is rounded (``cvt.rn.satfinite.e4m3x2``). That is
``degree + 6`` PTX instructions; ptxas fuses the shift and the add into one LEA, so ``degree + 5``
issue slots per element on the FP32 and integer pipes, no conversion unit, against one MUFU.EX2
(counted in the SASS of the CuTe fp8 forward's former ``exp2_fma_every`` option). (The torch
emulation below takes ``torch.floor``; the values are the same.)

The polynomial is ``p(f) = 1 + f + f (f - 1) q(f)``: ``p(0) = 1`` exactly, so powers of two, the
lifted row maximum ``2^8`` among them, come out exact, and ``p(1) = 2`` up to the float32 rounding
of the coefficients (about 3e-8), so ``2^x`` is continuous across integers to that precision.
``q`` is fit in float64 by least squares of the *relative* error on Chebyshev nodes (the E4M3
rounding cares about relative error); the coefficients are then rounded to float32, the precision
a kernel holds them in.

This module is the numerics (the torch definition a kernel would be tested against) and what
``bench/direct_p_e4m3_numerics.py`` measures, a CPU study: no kernel uses it. The CuTe fp8
forward's ``exp2_fma_every`` option computed it in inline PTX with these coefficients; on the H200
it was slower than the exp2 unit alone and was deleted (``backends/cute/fwd_sm90.py``; the option
is in the history before commit ce4c555).
"""

from __future__ import annotations

import functools
import math

import torch

from .formats import round_e4m3

__all__ = ["EXP2_MIN_X", "exp2_fma", "exp2_poly_coeffs", "exponent_grid", "p_e4m3_exact", "p_e4m3_fma"]

EXP2_MIN_X = -126.0  # 2^-126: the smallest normal FP32; E4M3 rounds everything below 2^-10 to 0


@functools.cache
def exp2_poly_coeffs(degree: int) -> tuple[float, ...]:
    """Coefficients ``(c_0, ..., c_degree)`` (float32 values, ``c_0 = 1``) of ``p(f) ~ 2^f`` on [0, 1).

    Args:
        degree: an int, 1 to 6. Degree 1 is ``1 + f`` (Mitchell's approximation, no fit).
    Returns:
        The monomial coefficients, lowest first, each exactly representable in float32.
    Raises:
        ValueError: degree not an int in 1..6.
    """
    if not isinstance(degree, int) or not 1 <= degree <= 6:
        raise ValueError(f"exp2_poly_coeffs: degree must be an int in 1..6, got {degree!r}")
    poly = torch.zeros(degree + 1, dtype=torch.float64)
    poly[0], poly[1] = 1.0, 1.0
    if degree >= 2:
        n = 1024
        k = torch.arange(n, dtype=torch.float64)
        f = 0.5 - 0.5 * torch.cos(torch.pi * (k + 0.5) / n)  # Chebyshev nodes on (0, 1)
        target = torch.exp2(f)
        # residual 2^f - (1 + f) = f (f - 1) q(f); relative weights 1 / 2^f
        basis = torch.stack([f * (f - 1) * f**j for j in range(degree - 1)], dim=1)
        w = 1.0 / target
        q = torch.linalg.lstsq(basis * w[:, None], ((target - 1 - f) * w)[:, None]).solution[:, 0]
        # f (f - 1) q(f) = sum_j q_j (f^(j+2) - f^(j+1))
        for j, qj in enumerate(q.tolist()):
            poly[j + 2] += qj
            poly[j + 1] -= qj
    return tuple(float(c) for c in poly.float())


def _fma32(a: torch.Tensor, b: torch.Tensor | float, c: torch.Tensor | float) -> torch.Tensor:
    """FP32 fused multiply-add: the product of two float32 values is exact in float64 and the sum is
    rounded once to float64, then to float32 (a double rounding: differs from a true FFMA with
    probability about 2^-29)."""
    return (a.double() * b + c).float()


def exp2_fma(x: torch.Tensor, degree: int = 4) -> torch.Tensor:
    """``2^x`` in float32 as the FMA-only kernel path computes it (see the module docstring).

    Args:
        x: float32 exponents, any shape. Values above 127 overflow FP32 (the softmax keeps x <= 8 +
            the lazy-rescale threshold <= log2 448). -inf (a masked score) and NaN give 2^-126 (as
            the kernel's ``max.f32`` clamp), which rounds to 0 in E4M3; +inf gives NaN.
        degree: degree of the polynomial for ``2^frac(x)`` (1 to 6).
    Returns:
        float32 tensor of x's shape.
    Raises:
        ValueError: x not float32, or degree outside 1..6.
    """
    if x.dtype != torch.float32:
        raise ValueError(f"exp2_fma: x must be float32 (the kernel's FP32 exponent), got {x.dtype}")
    coeffs = exp2_poly_coeffs(degree)
    x = torch.fmax(x, torch.tensor(EXP2_MIN_X))  # NaN -> -126, as PTX max.f32
    n = torch.floor(x)
    f = x - n  # float32 subtraction, as the kernel's FADD
    p = torch.full_like(f, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p = _fma32(p, f, c)
    return torch.ldexp(p, n)  # exact: p in [1, 2], 2^n a normal number (the kernel's SHL + IADD)


def p_e4m3_fma(x: torch.Tensor, degree: int = 4) -> torch.Tensor:
    """E4M3 values of the FP8 recipes' lifted P from the FMA path: ``round_e4m3(exp2_fma(x))``.

    Args:
        x: float32 exponents ``z - m + 8``, any shape; at most 8 plus the lazy-rescale threshold,
            which the recipes keep <= log2 448 (``recipes.check_saturation_invariant``), so P <= 448.
        degree: polynomial degree (1 to 6).
    Returns:
        float32 tensor of E4M3 values, x's shape (compare with ``round_e4m3(torch.exp2(x))``).
    """
    return round_e4m3(exp2_fma(x, degree))


def p_e4m3_exact(x: torch.Tensor) -> torch.Tensor:
    """E4M3 values of the exact path's lifted P, ``round_e4m3(2^x)``: 2^x in float64, then float32
    (within half an ulp, far from an E4M3 tie), then E4M3. The yardstick of :func:`p_e4m3_fma`.

    Args:
        x: exponents, any float dtype and shape.
    Returns:
        float32 tensor of E4M3 values, x's shape.
    """
    return round_e4m3(torch.exp2(x.double()).float())


def exponent_grid(step_log2: int = 12) -> torch.Tensor:
    """Every x in [-12, log2 448] in steps of ``2^-step_log2`` (float32): below 2^-10 E4M3 is 0, and
    above 8 lies the lazy-rescale headroom the recipes allow up to E4M3's 448."""
    scale = 2**step_log2
    return (
        torch.arange(-12 * scale, math.floor(math.log2(448.0) * scale) + 1, dtype=torch.float64) / scale
    ).float()
