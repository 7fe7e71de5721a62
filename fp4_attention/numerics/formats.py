"""Bit-exact codecs for the element and scale formats of the precision contract (§1).

Every function here maps between real values (torch float tensors) and *codes* (uint8 tensors
holding the format's bit pattern). They are the definition the GPU quantizers are tested against,
so they are written from the format definitions, not from torch's float8 casts (the tests check
the two agree wherever torch has the format).

| format | bits            | finite magnitudes                    | special codes                      |
|--------|-----------------|--------------------------------------|------------------------------------|
| E2M1   | s.ee.m, bias 1  | 0, 0.5, 1, 1.5, 2, 3, 4, 6           | none                               |
| E4M3   | s.eeee.mmm, b 7 | max 448, min normal 2^-6, sub 2^-9   | 0x7F / 0xFF NaN, no Inf (e4m3fn)   |
| E5M2   | s.eeeee.mm, b15 | max 57344, min normal 2^-14, 2^-16   | 0x7C Inf, 0x7D-0x7F NaN            |
| E8M0   | eeeeeeee        | 2^(u-127), u in 0..254               | 0xFF NaN                           |

Rounding is round-to-nearest, ties to even (on the code's last mantissa bit), as the hardware
``cvt.rn`` conversions do. Overflow saturates to the largest finite value (``.satfinite``).

Non-finite input (the documented codes, mirroring ``cvt.rn.satfinite``):
- E4M3 / E5M2: NaN -> the canonical NaN code 0x7F (sign kept: 0xFF for -NaN is *not* produced;
  we always emit 0x7F); +-Inf -> +-max finite (448 / 57344), i.e. saturated like any overflow.
- E8M0: NaN -> 0xFF. E8M0 encodes only exact powers of two; anything else is a ValueError.
- E2M1 has no code for NaN/Inf: ``encode_e2m1`` raises ``ValueError`` on non-finite input. The
  block quantizers in ``quant.py`` never pass non-finite values here: they mark the whole block
  through its scale instead (see that module).
"""

from __future__ import annotations

import torch

__all__ = [
    "E2M1_MAX",
    "E2M1_VALUES",
    "E4M3_MAX",
    "E4M3_NAN",
    "E5M2_MAX",
    "E5M2_NAN",
    "E8M0_BIAS",
    "E8M0_NAN",
    "decode_e2m1",
    "decode_e4m3",
    "decode_e5m2",
    "decode_e8m0",
    "encode_e2m1",
    "encode_e4m3",
    "encode_e5m2",
    "encode_e8m0",
    "pack_e2m1",
    "round_e2m1",
    "round_e4m3",
    "round_e5m2",
    "unpack_e2m1",
]

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
E4M3_NAN = 0x7F
E5M2_NAN = 0x7F
E8M0_NAN = 0xFF
E8M0_BIAS = 127

# Rounding boundaries between consecutive positive E2M1 magnitudes, and whether a value exactly
# on the boundary rounds up (the upper code's mantissa bit is 0, i.e. the upper code is even).
_E2M1_BOUNDARIES = (
    (0.25, False),
    (0.75, True),
    (1.25, False),
    (1.75, True),
    (2.5, False),
    (3.5, True),
    (5.0, False),
)


def _require_float(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype}")


def _require_codes(c: torch.Tensor, name: str) -> None:
    if not isinstance(c, torch.Tensor) or c.dtype != torch.uint8:
        got = c.dtype if isinstance(c, torch.Tensor) else type(c).__name__
        raise TypeError(f"{name}: expected a torch.uint8 code tensor, got {got}")


# --------------------------------------------------------------------------------------------
# E2M1 (FP4)
# --------------------------------------------------------------------------------------------


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Encode real values as E2M1 codes (one code per uint8, low 4 bits; bit 3 is the sign).

    Args:
        x: any shape, any float dtype. Values are rounded to nearest, ties to even, and saturate
            at +-6. The sign of zero is kept (-0.0 and values rounding to -0 give code 8).
    Returns:
        uint8 tensor of x's shape with codes 0..15.
    Raises:
        ValueError: if x holds NaN or +-Inf (E2M1 has no code for them).
    """
    _require_float(x, "encode_e2m1")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("encode_e2m1: E2M1 has no NaN/Inf codes; mask non-finite values first")
    a = x.abs().to(torch.float64)
    idx = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for bound, tie_up in _E2M1_BOUNDARIES:
        idx += (a >= bound if tie_up else a > bound).to(torch.uint8)
    sign = torch.signbit(x).to(torch.uint8) << 3
    return idx | sign


def decode_e2m1(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode E2M1 codes (uint8, low 4 bits used) to real values of ``dtype`` (exact)."""
    _require_codes(codes, "decode_e2m1")
    table = torch.tensor(E2M1_VALUES, dtype=dtype, device=codes.device)
    mag = table[(codes & 0x7).long()]
    return torch.where((codes & 0x8) != 0, -mag, mag)


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 value (ties to even, saturating); same dtype as x."""
    return decode_e2m1(encode_e2m1(x), dtype=x.dtype)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes two per byte along the last dim: element 2i low nibble, 2i+1 high nibble.

    Args:
        codes: uint8 [..., N] with N even.
    Returns:
        uint8 [..., N // 2].
    Raises:
        ValueError: if the last dim is odd.
    """
    _require_codes(codes, "pack_e2m1")
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_e2m1: last dim must be even, got {codes.shape[-1]}")
    lo = codes[..., 0::2] & 0xF
    hi = codes[..., 1::2] & 0xF
    return lo | (hi << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_e2m1`: uint8 [..., N // 2] -> uint8 codes [..., N]."""
    _require_codes(packed, "unpack_e2m1")
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


# --------------------------------------------------------------------------------------------
# Generic IEEE-like minifloat (E4M3 "fn" and E5M2)
# --------------------------------------------------------------------------------------------


def _encode_minifloat(
    x: torch.Tensor, *, ebits: int, mbits: int, bias: int, max_finite: float, nan_code: int
) -> torch.Tensor:
    """Round-to-nearest-even, saturating encoder of a sign/exponent/mantissa minifloat."""
    xd = x.to(torch.float64)
    nan = torch.isnan(xd)
    sign = torch.signbit(xd)
    a = xd.abs().nan_to_num(nan=0.0).clamp(max=max_finite)  # Inf -> max (satfinite)
    min_normal_exp = 1 - bias
    # Exponent of a's leading bit; subnormals (and zero) use the minimum normal exponent.
    _, e2 = torch.frexp(a)  # a = m * 2^e2, m in [0.5, 1)
    e = torch.clamp(e2.to(torch.int64) - 1, min=min_normal_exp)
    # Scaled significand in units of the last mantissa bit at exponent e; exact in float64.
    ulp_exp = e - mbits
    sig = torch.round(torch.ldexp(a, (-ulp_exp).to(torch.float64)))  # round half to even
    # Rounding may carry into the next binade: sig == 2^(mbits+1).
    carry = sig >= 2 ** (mbits + 1)
    sig = torch.where(carry, sig / 2, sig)
    e = torch.where(carry, e + 1, e)
    is_normal = sig >= 2**mbits
    exp_field = torch.where(is_normal, e + bias, torch.zeros_like(e))
    man_field = torch.where(is_normal, sig - 2**mbits, sig).to(torch.int64)
    code = (exp_field << mbits) | man_field
    code = code | (sign.to(torch.int64) << (ebits + mbits))
    code = torch.where(nan, torch.full_like(code, nan_code), code)
    return code.to(torch.uint8)


def _decode_minifloat(
    codes: torch.Tensor, *, ebits: int, mbits: int, bias: int, dtype: torch.dtype, is_nan, is_inf
) -> torch.Tensor:
    c = codes.to(torch.int64)
    sign = (c >> (ebits + mbits)) & 1
    exp_field = (c >> mbits) & ((1 << ebits) - 1)
    man = (c & ((1 << mbits) - 1)).to(torch.float64)
    normal = exp_field > 0
    mag = torch.where(
        normal,
        torch.ldexp(1.0 + man / 2**mbits, (exp_field - bias).to(torch.float64)),
        torch.ldexp(man / 2**mbits, torch.full_like(man, 1 - bias)),
    )
    val = torch.where(sign == 1, -mag, mag)
    val = torch.where(is_inf(c), torch.where(sign == 1, -torch.inf, torch.inf), val)
    val = torch.where(is_nan(c), torch.full_like(val, torch.nan), val)
    return val.to(dtype)


def encode_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Encode to E4M3 (OCP "e4m3fn") codes with round-to-nearest-even and saturation at +-448.

    Args:
        x: any shape, any float dtype (converted exactly to float64 first).
    Returns:
        uint8 codes of x's shape. NaN -> 0x7F; +-Inf and |x| > 448 -> +-448 (0x7E / 0xFE).
    """
    _require_float(x, "encode_e4m3")
    return _encode_minifloat(x, ebits=4, mbits=3, bias=7, max_finite=E4M3_MAX, nan_code=E4M3_NAN)


def decode_e4m3(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode E4M3 codes to ``dtype`` (exact; 0x7F/0xFF decode to NaN)."""
    _require_codes(codes, "decode_e4m3")
    return _decode_minifloat(
        codes,
        ebits=4,
        mbits=3,
        bias=7,
        dtype=dtype,
        is_nan=lambda c: (c & 0x7F) == 0x7F,
        is_inf=lambda c: torch.zeros_like(c, dtype=torch.bool),
    )


def encode_e5m2(x: torch.Tensor) -> torch.Tensor:
    """Encode to E5M2 codes with round-to-nearest-even and saturation at +-57344.

    Args:
        x: any shape, any float dtype.
    Returns:
        uint8 codes. NaN -> 0x7F; +-Inf and overflow -> +-57344 (0x7B / 0xFB); the Inf codes
        0x7C/0xFC are never produced (satfinite), but decode to +-Inf.
    """
    _require_float(x, "encode_e5m2")
    return _encode_minifloat(x, ebits=5, mbits=2, bias=15, max_finite=E5M2_MAX, nan_code=E5M2_NAN)


def decode_e5m2(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode E5M2 codes to ``dtype`` (exact; 0x7C Inf, 0x7D-0x7F NaN, with sign)."""
    _require_codes(codes, "decode_e5m2")
    return _decode_minifloat(
        codes,
        ebits=5,
        mbits=2,
        bias=15,
        dtype=dtype,
        is_nan=lambda c: (c & 0x7F) > 0x7C,
        is_inf=lambda c: (c & 0x7F) == 0x7C,
    )


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Saturating round-to-nearest-even to E4M3 values, returned in float32.

    Fast path used by the reference attention: clamps to +-448 and uses torch's float8_e4m3fn
    cast (round-to-nearest-even); ``tests/numerics/test_formats.py`` checks it equals
    ``decode_e4m3(encode_e4m3(x))`` bit for bit, NaN included.
    """
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def round_e5m2(x: torch.Tensor) -> torch.Tensor:
    """Saturating round-to-nearest-even to E5M2 values, in float32 (torch float8_e5m2 cast)."""
    return x.float().clamp(-E5M2_MAX, E5M2_MAX).to(torch.float8_e5m2).float()


# --------------------------------------------------------------------------------------------
# E8M0 (MX block scale)
# --------------------------------------------------------------------------------------------


def encode_e8m0(x: torch.Tensor) -> torch.Tensor:
    """Encode exact powers of two 2^k (k in -127..127) as E8M0 codes k + 127; NaN -> 0xFF.

    Raises:
        ValueError: if a value is not a positive power of two inside the E8M0 range (E8M0 is a
            pure exponent: rounding a scale is the caller's decision, see ``quant.py``).
    """
    _require_float(x, "encode_e8m0")
    xd = x.to(torch.float64)
    nan = torch.isnan(xd)
    m, e = torch.frexp(xd.nan_to_num(nan=1.0))
    ok = (m == 0.5) & (e - 1 >= -127) & (e - 1 <= 127)
    if not bool((ok | nan).all()):
        raise ValueError("encode_e8m0: E8M0 holds only powers of two 2^k with -127 <= k <= 127")
    code = (e.to(torch.int64) - 1 + E8M0_BIAS).clamp(0, 254)
    return torch.where(nan, torch.full_like(code, E8M0_NAN), code).to(torch.uint8)


def decode_e8m0(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode E8M0 codes to 2^(code-127) in ``dtype`` (0xFF -> NaN).

    Note 2^-127 is a float32 subnormal; it is exact in float32 and float64.
    """
    _require_codes(codes, "decode_e8m0")
    c = codes.to(torch.int64)
    val = torch.ldexp(torch.ones_like(c, dtype=torch.float64), (c - E8M0_BIAS).to(torch.float64))
    val = torch.where(c == E8M0_NAN, torch.full_like(val, torch.nan), val)
    return val.to(dtype)
