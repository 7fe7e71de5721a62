"""NVFP4 / MXFP4 / scaled-FP8 quantizers against hand-computed examples (contract §1)."""

import pytest
import torch

from fp4_attention.numerics import formats as F
from fp4_attention.numerics.quant import (
    nvfp4_global_scale,
    pow2_ceil,
    quantize_fp8,
    quantize_fp8_key_groups,
    quantize_mxfp4,
    quantize_mxfp4_paper,
    quantize_nvfp4,
)

ONE = torch.ones(1, 1)


def _values(nv):
    return F.decode_e2m1(F.unpack_e2m1(nv.payload))


def test_nvfp4_hand_example_unit_global_scale():
    b1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -6, -4, -3, -2, -1.5, -1, -0.5, 0.25]
    b2 = [60, 30, 7, 8, -20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]  # amax 60 -> s_b = E4M3(10) = 10
    x = torch.tensor([b1 + b2])
    nv = quantize_nvfp4(x, global_scale=ONE)
    assert F.decode_e4m3(nv.block_scale).tolist() == [[1.0, 10.0]]
    assert _values(nv)[0, :16].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, -6, -4, -3, -2, -1.5, -1, -0.5, 0]
    # 60/10=6, 30/10=3, 7/10=0.7 -> 0.5, 8/10=0.8 -> 1, -20/10=-2
    assert _values(nv)[0, 16:21].tolist() == [6, 3, 0.5, 1, -2]
    assert nv.dequantize()[0, 16:21].tolist() == [60, 30, 5, 10, -20]
    assert nv.payload.shape == (1, 16) and nv.block_scale.shape == (1, 2)


def test_nvfp4_scale_rounding_saturates_payload():
    # amax_b / 6 = 1.0625 ties to E4M3 1.0, so 6.375 / 1.0 saturates at 6
    x = torch.zeros(1, 16)
    x[0, 0] = 6.375
    nv = quantize_nvfp4(x, global_scale=ONE)
    assert F.decode_e4m3(nv.block_scale).item() == 1.0 and _values(nv)[0, 0].item() == 6.0


def test_nvfp4_global_scale_formula_and_zero_blocks():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, 64, generator=g)
    x[0, 1, 2, 16:32] = 0.0  # a zero block
    gs = nvfp4_global_scale(x, dims=(2, 3))
    assert gs.shape == (2, 3, 1, 1)
    amax = x.abs().amax(dim=(2, 3), keepdim=True)
    assert torch.equal(gs, amax / torch.full_like(amax, 2688.0))
    nv = quantize_nvfp4(x, gs)
    assert nv.block_scale[0, 1, 2, 1] == 0 and torch.all(_values(nv)[0, 1, 2, 16:32] == 0)
    # the head amax maps to 448 * 6 exactly: the largest block scale code is 448 (0x7E)
    assert int(nv.block_scale.amax()) == 0x7E
    err = (nv.dequantize() - x).abs()
    bound = F.decode_e4m3(nv.block_scale).repeat_interleave(16, -1) * gs * 1.0  # half the widest E2M1 gap (2)
    assert torch.all(err <= bound + 1e-7)
    assert nvfp4_global_scale(torch.zeros(4, 16)).item() == 1.0  # all-zero tensor: g = 1


def test_nvfp4_block_underflow_is_zero():
    x = torch.zeros(1, 32)
    x[0, 0] = 1000.0
    x[0, 16:32] = 1e-6  # scale 1e-6/6/g underflows E4M3 -> whole block 0
    nv = quantize_nvfp4(x)
    assert nv.block_scale[0, 1] == 0 and torch.all(nv.dequantize()[0, 16:] == 0)


def test_nvfp4_non_finite_poisons_the_group():
    x = torch.ones(2, 32)
    x[0, 3] = float("nan")
    per_row = nvfp4_global_scale(x, dims=(1,))
    nv = quantize_nvfp4(x, per_row)
    assert per_row[0].isnan().all() and per_row[1].isfinite().all()
    assert torch.all(nv.block_scale[0] == F.E4M3_NAN)
    deq = nv.dequantize()
    assert deq[0].isnan().all() and torch.equal(deq[1], x[1])
    # an Inf inside one block with a finite given global scale marks only that block
    y = torch.ones(1, 32)
    y[0, 20] = float("inf")
    nv = quantize_nvfp4(y, global_scale=ONE)
    assert nv.block_scale.tolist() == [[F.encode_e4m3(torch.tensor(1 / 6)).item(), F.E4M3_NAN]]


def test_nvfp4_rejects_bad_block_dim():
    with pytest.raises(ValueError, match="multiple of the block size 16"):
        quantize_nvfp4(torch.ones(2, 24))


def test_mxfp4_ocp_scale_rule():
    x = torch.zeros(3, 32)
    x[0, :3] = torch.tensor([5.0, 2.5, 7.0])  # floor(log2 7) - 2 = 0: 5 ties to 4, 2.5 -> 2, 7 clips to 6
    x[1, :2] = torch.tensor([0.3, -0.1])  # e = -2 - 2 = -4: 0.3*16 = 4.8 -> 4, -1.6 -> -1.5
    mx = quantize_mxfp4(x)
    assert mx.block_scale.squeeze(-1).tolist() == [127, 123, 0]  # zero block -> 2^-127
    assert mx.codes()[0, :3].tolist() == [4, 2, 6]
    assert mx.codes()[1, :2].tolist() == [4, -1.5]
    assert mx.dequantize()[1, :2].tolist() == [0.25, -0.09375]
    assert torch.all(mx.dequantize()[2] == 0)


def test_mxfp4_paper_convention_worked_example():
    x = torch.zeros(1, 32, dtype=torch.float64)
    x[0, :4] = torch.tensor([1.0, 2 / 3, 1 / 3, 1 / 6], dtype=torch.float64)
    mx = quantize_mxfp4_paper(x)
    assert mx.block_scale.item() == 127  # alpha_B = 2^0
    assert mx.codes()[0, :4].tolist() == [6, 4, 2, 1]
    assert mx.codes().sum().item() == 13  # represented denominator 13/6 = exact sum 1 + 2/3 + 1/3 + 1/6
    assert torch.allclose(mx.dequantize(torch.float64)[0, :4], x[0, :4], rtol=0, atol=1e-15)
    # the OCP rule on the same block: scale 2^-2, codes 4, 3, 1.5, 0.5 (contract §2)
    ocp = quantize_mxfp4(x.float())
    assert ocp.block_scale.item() == 125 and ocp.codes()[0, :4].tolist() == [4, 3, 1.5, 0.5]


def test_mxfp4_paper_block_max_in_3_6_never_clips():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 32, generator=g) * torch.exp(torch.randn(64, 1, generator=g) * 4)
    mx = quantize_mxfp4_paper(x)
    top = mx.codes().abs().amax(-1)
    assert torch.all((top >= 3) & (top <= 6))
    scaled = 6 * x.abs().amax(-1) / mx.scales().squeeze(-1)
    assert torch.all((scaled > 3) & (scaled <= 6))


def test_mxfp4_nan_block_code():
    x = torch.ones(1, 64)
    x[0, 40] = float("nan")
    mx = quantize_mxfp4(x)
    assert mx.block_scale.tolist() == [[127 - 2, F.E8M0_NAN]]
    assert mx.dequantize()[0, 32:].isnan().all() and mx.dequantize()[0, :32].isfinite().all()


@pytest.mark.parametrize(
    "fmt, dt, fmax", [("e4m3", torch.float8_e4m3fn, 448.0), ("e5m2", torch.float8_e5m2, 57344.0)]
)
@pytest.mark.parametrize(
    "dims, scale_shape", [((-1,), (2, 3, 5, 1)), ((-2,), (2, 3, 1, 16)), ((-2, -1), (2, 3, 1, 1))]
)
def test_fp8_granularities_bytes_equal_codec(fmt, dt, fmax, dims, scale_shape):
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(2, 3, 5, 16, generator=g) * 3).bfloat16()
    x[0, 0] = 0  # an all-zero slice
    t = quantize_fp8(x, fmt, dims)
    assert t.scale.shape == scale_shape and t.data.dtype == dt
    amax = x.float().abs().amax(dim=dims, keepdim=True)
    expect_scale = torch.where(amax == 0, torch.ones_like(amax), amax / torch.full_like(amax, fmax))
    assert torch.equal(t.scale, expect_scale)
    enc = F.encode_e4m3 if fmt == "e4m3" else F.encode_e5m2
    assert torch.equal(t.data.view(torch.uint8), enc(x.float() / t.scale))
    assert torch.equal(
        t.data.float().abs().amax(dim=dims, keepdim=True)[amax > 0], torch.full_like(amax[amax > 0], fmax)
    )


def test_pow2_ceil_is_the_next_power_of_two_exactly():
    s = torch.tensor([1.0, 0.75, 0.5000001, 3.0, 4.0, 448.0, 1e-40, 2.0**-149, float("nan")])
    got = pow2_ceil(s)
    assert got[:-1].tolist() == [1.0, 1.0, 1.0, 4.0, 4.0, 512.0, 2.0**-132, 2.0**-149]
    assert got[-1].isnan()
    x = torch.rand(10000, generator=torch.Generator().manual_seed(1)) * 1e3 + 1e-30
    p = pow2_ceil(x)
    assert torch.equal(torch.frexp(p)[0], torch.full_like(p, 0.5))  # powers of two
    assert (p >= x).all() and (p / 2 < x).all()


def test_fp8_pow2_scale_maps_the_slice_max_into_the_top_binade():
    """V's per-channel scale (pow2=True): a power of two with amax / s in (224, 448], so nothing
    clips (the max is 224 or above); the payload is the E4M3 rounding of x / s; and
    bf16(y * s) / s == bf16(y) exactly."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 3, 64, 16, generator=g) * torch.rand(1, 1, 1, 16, generator=g) * 50).bfloat16()
    x[0, 0, :, 3] = 0  # an all-zero channel: scale 1
    t = quantize_fp8(x, "e4m3", dims=(-2,), pow2=True)
    plain = quantize_fp8(x, "e4m3", dims=(-2,))
    assert torch.equal(t.scale, pow2_ceil(plain.scale)) and t.scale[0, 0, 0, 3] == 1.0
    assert torch.equal(torch.frexp(t.scale)[0], torch.full_like(t.scale, 0.5))
    top = t.data.float().abs().amax(dim=-2, keepdim=True)
    nz = x.float().abs().amax(dim=-2, keepdim=True) > 0
    assert ((top >= 224) & (top <= 448))[nz].all()  # 224.x rounds to 224 in E4M3
    assert torch.equal(t.data.view(torch.uint8), F.encode_e4m3(x.float() / t.scale))
    y = torch.randn(2, 3, 64, 16, generator=g)
    assert torch.equal((y * t.scale).bfloat16().float() / t.scale, y.bfloat16().float())


def test_fp8_non_finite_slice_is_nan():
    x = torch.ones(2, 4)
    x[1, 2] = float("inf")
    t = quantize_fp8(x, "e4m3", dims=(-1,))
    assert (
        t.scale[1].isnan().all() and t.dequantize()[1].isnan().all() and torch.equal(t.dequantize()[0], x[0])
    )


def test_fp8_key_groups_one_scale_per_group_of_keys():
    """K per 64 keys: each group's scale is amax(group) / 448 repeated per key, the last group
    shorter; a group holding an Inf is NaN (codes 0x7F) and the others are untouched."""
    g = torch.Generator().manual_seed(0)
    k = torch.randn(2, 3, 150, 16, generator=g).bfloat16()
    k[1, 2, 70, 3] = 50.0  # the second group's amax
    k[0, 1, 140, 0] = float("inf")  # poisons the third (shorter) group of that head
    t = quantize_fp8_key_groups(k, 64)
    assert t.data.shape == k.shape and t.scale.shape == (2, 3, 150, 1)
    for j0, j1 in ((0, 64), (64, 128), (128, 150)):
        want = quantize_fp8(k[:, :, j0:j1].float(), "e4m3", dims=(-2, -1))
        assert torch.equal(t.data[:, :, j0:j1].view(torch.uint8), want.data.view(torch.uint8))
        got_s = t.scale[:, :, j0:j1]
        assert torch.equal(got_s.nan_to_num(-1.0), want.scale.expand_as(got_s).nan_to_num(-1.0))
    assert float(t.scale[1, 2, 100, 0]) == float(torch.tensor(50.0) / 448)
    assert t.scale[0, 1, 128:].isnan().all() and t.scale[0, 1, :128].isfinite().all()
    assert (t.data[0, 1, 128:].view(torch.uint8) == 0x7F).all()
    with pytest.raises(ValueError, match="keys >= 1"):
        quantize_fp8_key_groups(k, 0)


def test_fp8_rejects_unknown_format():
    with pytest.raises(ValueError, match="fmt must be one of"):
        quantize_fp8(torch.ones(2, 2), "e3m4", dims=(-1,))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nvfp4_global_scale_matches_definition(dtype):
    """g = amax/2688 per group (IEEE division), 1 for an all-zero group, NaN for a group holding a
    NaN, +Inf or -Inf; checked against the definition computed elementwise in float64."""
    x = (torch.randn(4, 3, 7, 32, generator=torch.Generator().manual_seed(5)) * 3).to(dtype)
    x[0, 0, 1, 2], x[0, 1, 3, 4], x[0, 2, 0, 0], x[1, 0] = float("nan"), float("inf"), float("-inf"), 0.0
    g = nvfp4_global_scale(x, dims=(2, 3))
    for b in range(4):
        for h in range(3):
            grp = x[b, h].double()
            if not torch.isfinite(grp).all():
                assert torch.isnan(g[b, h]).all()
                continue
            amax = grp.abs().max()
            want = 1.0 if amax == 0 else float(torch.tensor(float(amax), dtype=torch.float32) / 2688.0)
            assert g[b, h].item() == want, (b, h)
