"""Bit-exact codecs (contract §1): round trips, ties to even, saturation, specials."""

import pytest
import torch

from fp4_attention.numerics import formats as F

ALL = torch.arange(256, dtype=torch.uint8)
CODES16 = torch.arange(16, dtype=torch.uint8)


def test_e2m1_every_code_round_trips():
    vals = F.decode_e2m1(CODES16)
    assert vals.tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert torch.signbit(vals[8])  # code 8 is -0
    assert torch.equal(F.encode_e2m1(vals), CODES16)


@pytest.mark.parametrize(
    "x, code",
    [
        (0.25, 0),
        (0.75, 2),
        (1.25, 2),
        (1.75, 4),
        (2.5, 4),
        (3.5, 6),
        (5.0, 6),  # ties -> even code
        (0.2500001, 1),
        (0.7499999, 1),
        (1.2500001, 3),
        (4.9999, 6),
        (5.0001, 7),
        (6.0, 7),
        (7.0, 7),
        (1e30, 7),
        (-1e30, 15),
        (-0.1, 8),
        (0.1, 0),
        (-0.0, 8),
    ],
)
def test_e2m1_rounding_ties_to_even_and_saturation(x, code):
    assert int(F.encode_e2m1(torch.tensor([x], dtype=torch.float64))[0]) == code


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_e2m1_rejects_non_finite(bad):
    with pytest.raises(ValueError, match="NaN/Inf"):
        F.encode_e2m1(torch.tensor([1.0, bad]))


@pytest.mark.parametrize(
    "enc, dec, dt, fmax",
    [
        (F.encode_e4m3, F.decode_e4m3, torch.float8_e4m3fn, 448.0),
        (F.encode_e5m2, F.decode_e5m2, torch.float8_e5m2, 57344.0),
    ],
)
def test_fp8_codecs_every_code_and_torch_agreement(enc, dec, dt, fmax):
    vals = dec(ALL)
    ref = ALL.view(dt).float()
    assert torch.equal(vals.isnan(), ref.isnan())
    fin = vals.isfinite()
    assert torch.equal(vals[fin], ref[fin])
    assert torch.equal(enc(vals[fin]), ALL[fin])  # every finite code round-trips (signed zeros too)
    assert vals[fin].abs().max() == fmax
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100_000, generator=g) * torch.exp(torch.randn(100_000, generator=g) * 5)
    assert torch.equal(enc(x), x.clamp(-fmax, fmax).to(dt).view(torch.uint8))


def test_e4m3_ties_subnormals_saturation_specials():
    t = torch.tensor
    # between 1.0 (0x38) and 1.125 (0x39): midpoint ties to the even code 0x38; above goes up
    assert F.encode_e4m3(t([1.0625, 1.0626, 1.1875])).tolist() == [0x38, 0x39, 0x3A]
    # subnormals: min 2^-9 (0x01); half of it ties to 0 (even)
    assert F.encode_e4m3(t([2.0**-9, 2.0**-10, 3 * 2.0**-11])).tolist() == [0x01, 0x00, 0x01]
    assert F.decode_e4m3(t([0x01], dtype=torch.uint8)).item() == 2.0**-9
    assert F.decode_e4m3(t([0x08], dtype=torch.uint8)).item() == 2.0**-6  # min normal
    # saturation (satfinite): overflow and Inf -> +-448; NaN -> 0x7F
    assert F.encode_e4m3(t([449.0, 1e9, float("inf"), -float("inf"), float("nan")])).tolist() == [
        0x7E,
        0x7E,
        0x7E,
        0xFE,
        0x7F,
    ]
    assert F.round_e4m3(t([464.0, 1e6, -1e6])).tolist() == [448.0, 448.0, -448.0]


def test_e5m2_specials():
    t = torch.tensor
    assert F.encode_e5m2(t([57344.0, 61440.0, float("inf"), float("nan")])).tolist() == [
        0x7B,
        0x7B,
        0x7B,
        0x7F,
    ]
    assert F.decode_e5m2(t([0x7C, 0xFC, 0x7D, 0x01], dtype=torch.uint8)).tolist()[:2] == [
        float("inf"),
        -float("inf"),
    ]
    assert F.decode_e5m2(t([0x01], dtype=torch.uint8)).item() == 2.0**-16
    assert F.encode_e5m2(t([2.0**-17, 2.0**-16 * 1.5])).tolist() == [0x00, 0x02]  # ties to even


@pytest.mark.parametrize(
    "fast, enc, fmax", [(F.round_e4m3, F.encode_e4m3, 448.0), (F.round_e5m2, F.encode_e5m2, 57344.0)]
)
def test_fast_rounding_matches_codec(fast, enc, fmax):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(50_000, generator=g) * torch.exp(torch.randn(50_000, generator=g) * 6)
    x = torch.cat([x, torch.tensor([float("nan"), 0.0, -0.0])])
    dec = F.decode_e4m3 if enc is F.encode_e4m3 else F.decode_e5m2
    a, b = fast(x), dec(enc(x))
    assert torch.equal(a.isnan(), b.isnan())
    assert torch.equal(a[~a.isnan()], b[~b.isnan()])


def test_e8m0_round_trip_and_rejects_non_powers():
    codes = torch.arange(255, dtype=torch.uint8)
    vals = F.decode_e8m0(codes, dtype=torch.float64)
    assert vals[0] == 2.0**-127 and vals[127] == 1.0 and vals[254] == 2.0**127
    assert torch.equal(F.encode_e8m0(vals), codes)
    assert F.decode_e8m0(torch.tensor([0xFF], dtype=torch.uint8)).isnan().all()
    assert F.encode_e8m0(torch.tensor([float("nan")])).tolist() == [0xFF]
    with pytest.raises(ValueError, match="powers of two"):
        F.encode_e8m0(torch.tensor([3.0]))
    with pytest.raises(ValueError, match="powers of two"):
        F.encode_e8m0(torch.tensor([2.0**128], dtype=torch.float64))


def test_pack_unpack_nibble_order():
    codes = torch.tensor([[1, 2, 3, 15]], dtype=torch.uint8)
    packed = F.pack_e2m1(codes)
    assert packed.tolist() == [[0x21, 0xF3]]  # element 2i in the low nibble
    assert torch.equal(F.unpack_e2m1(packed), codes)
    with pytest.raises(ValueError, match="even"):
        F.pack_e2m1(torch.zeros(3, dtype=torch.uint8))


def test_codecs_reject_wrong_dtypes():
    with pytest.raises(TypeError):
        F.decode_e4m3(torch.zeros(2, dtype=torch.int32))
    with pytest.raises(TypeError):
        F.encode_e4m3(torch.zeros(2, dtype=torch.int32))
