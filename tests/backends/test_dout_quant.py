"""The fused dO preparation (``triton.dout_quant``) on the GPU: the E5M2 codes and scales equal
``backends.dout.quantize_dout``'s bytes, dO^T is their ``V_PERM16`` transpose, the dK operand
BF16(q8 * Q scale * 2^-8) equals torch's nearest-even rounding for every E4M3 code, D matches up to
FP32 summation order (the layout and vector checks also run interpreted on CPU:
test_dout_quant_cpu.py). The CuTe backward's K/V operands (``triton.bwd_kv``: ``kb`` = BF16(k8 * K
scale * 2^-8)) equal torch's bytes (also interpreted: test_bwd_kv_cpu.py)."""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from fp4_attention.backends.dout import quantize_dout  # noqa: E402
from fp4_attention.backends.pv_layout import permute_v_for_pv  # noqa: E402
from fp4_attention.backends.triton.dout_quant import quantize_dout_fused  # noqa: E402
from fp4_attention.numerics.quant import FP8Tensor, pow2_ceil  # noqa: E402


@pytest.mark.parametrize(
    "b, hq, hkv, sq, d", [(1, 4, 2, 100, 64), (2, 8, 2, 1000, 128), (1, 32, 8, 4096, 128)]
)
@pytest.mark.parametrize("special", [None, "nan", "zero", "large", "tiny_head", "signed_zeros", "tiny_vs"])
def test_codes_equal_the_torch_definition(b, hq, hkv, sq, d, special):
    g = torch.Generator().manual_seed(sq)
    dout = torch.randn(b, hq, sq, d, generator=g).bfloat16().cuda()
    out = torch.randn(b, hq, sq, d, generator=g).bfloat16().cuda()
    vs = pow2_ceil(torch.rand(b, hkv, d, generator=g) * 0.1 + 1e-3).contiguous().cuda()
    if special == "nan":
        dout[0, 1, 5, 7] = float("nan")
    elif special == "zero":
        dout[0, 0] = 0.0
    elif special == "large":
        dout[0, 0, 3] *= 1e4
    elif special == "tiny_head":  # a head at 2^-100 of the others: its scale near the FP32 floor
        dout[0, 1] *= 2.0**-100
    elif special == "signed_zeros":  # -0.0 and quotients far below E5M2's range keep their sign
        dout[0, 0, 2, :5] = -0.0
        dout[0, 0, 2, 5:9] = -(2.0**-100)
    elif special == "tiny_vs":  # a channel scale whose reciprocal overflows: D divides by it
        vs[0, 0, 3] = 2.0**-130
    lse = torch.randn(b, hq, sq, device="cuda")
    qs = torch.rand(b, hq, sq, device="cuda")
    q8 = torch.randint(0, 256, (b, hq, sq, d), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    kw = dict(lift=8, pad_to=64, transposed=True, q_scale=qs, qk_scale_log2=0.3, q8=q8)
    got = quantize_dout_fused(dout, out, vs, lse, **kw)
    ref_q, ref_s, ref_delta = quantize_dout(dout, out, vs)
    ref_qb = (q8.float() * (qs * 2.0**-8).unsqueeze(-1)).bfloat16()  # nearest even
    assert torch.equal(got.qb.isnan(), ref_qb.isnan())
    assert torch.equal(got.qb.nan_to_num(0.0), ref_qb.nan_to_num(0.0))
    assert torch.equal(got.do_q.data.view(torch.uint8), ref_q.data.view(torch.uint8))
    assert torch.equal(got.s_do.nan_to_num(-1.0), ref_s.nan_to_num(-1.0))
    assert torch.equal(
        permute_v_for_pv(ref_q.data.transpose(-1, -2)).view(torch.uint8), got.dot.view(torch.uint8)
    )
    # D is a sum of D products in FP32 in another order: the bound is D ulps of the sum of their
    # magnitudes (a row can cancel to near zero, so no relative bound holds)
    vq = vs.repeat_interleave(hq // hkv, dim=1).unsqueeze(2)
    mag = (ref_q.dequantize() * out.float() / vq).abs().sum(-1)
    err = (got.delta[..., :sq] - ref_delta).abs()
    ok = (err <= d * 2.0**-24 * mag) | (got.delta[..., :sq].isnan() & ref_delta.isnan())
    assert bool(ok.all()), float((err / mag).nan_to_num(0.0).max())


@pytest.mark.parametrize("b, h, sk, d", [(1, 2, 100, 64), (2, 8, 1000, 128), (4, 8, 4096, 128)])
def test_backward_kv_operands_equal_torch(b, h, sk, d):
    from fp4_attention.backends.pv_layout import unpermute_v_keys
    from fp4_attention.backends.triton.bwd_kv import backward_kv_operands

    k8 = torch.randint(0, 256, (b, h, sk, d), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    v = torch.randint(0, 256, (b, h, sk, d), dtype=torch.uint8, device="cuda")
    vt = permute_v_for_pv(v.transpose(-1, -2).contiguous()).contiguous().view(torch.float8_e4m3fn)
    ks = torch.rand(b, h, sk, 1, device="cuda") + 0.5
    kv = backward_kv_operands(FP8Tensor(data=k8, scale=ks), vt, col2_scale=2.0**-8)
    kb, v8 = kv["kb"], kv["v8"]
    assert kv["col"].data_ptr() == ks.data_ptr() and torch.equal(kv["col2"], ks.view(b, h, sk) * 2.0**-8)
    ref = (k8.float() * (ks * 2.0**-8)).bfloat16()  # nearest even
    assert torch.equal(kb.isnan(), ref.isnan()) and torch.equal(kb.nan_to_num(0.0), ref.nan_to_num(0.0))
    want = unpermute_v_keys(vt, sk).transpose(-1, -2).contiguous()
    assert torch.equal(v8.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(v8.view(torch.uint8), v)
