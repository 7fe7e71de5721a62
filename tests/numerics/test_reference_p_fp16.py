"""The reference's ``p_fp16`` (the CuTe forward's measurement option ``exp_f16``): P through FP16 with
the kernel's row-sum tree, on the CPU."""

import pytest
import torch

import fp4_attention as fa
from fp4_attention.numerics.operands import quantize_qk, quantize_v
from fp4_attention.numerics.reference import _p_fp16, reference_forward_quantized

from ..conftest import make_qkv, rel_l2


def _kernel_row_sum(p16: torch.Tensor, block_n: int) -> torch.Tensor:
    """The row sum as the kernel's four threads of a row compute it, one scalar at a time: thread t
    holds keys 8j + 2t + h; for each h a pairwise FP16 tree over j (odd word carried), its two
    halves added in FP32, the threads' values added in FP32."""
    rows = []
    for row in p16.reshape(-1, p16.shape[-1]):
        row = torch.nn.functional.pad(row, (0, block_n - row.numel()))
        total = torch.zeros((), dtype=torch.float32)
        for t in range(4):
            halves = []
            for h in range(2):
                words = [row[8 * j + 2 * t + h] for j in range(block_n // 8)]
                while len(words) > 1:
                    nxt = [(words[i] + words[i + 1]).half() for i in range(0, len(words) - 1, 2)]
                    words = nxt + ([words[-1]] if len(words) % 2 else [])
                halves.append(words[0].float())
            total = total + (halves[0] + halves[1])
        rows.append(total)
    return torch.stack(rows).reshape(*p16.shape[:-1], 1)


@pytest.mark.parametrize("n, block_n", [(128, 128), (192, 192), (100, 128), (137, 192), (8, 64)])
def test_p_fp16_values_and_row_sum(n, block_n):
    g = torch.Generator().manual_seed(n)
    x = 8 - torch.rand(3, 5, n, generator=g) * 20  # the lifted argument, in (-12, 8]
    x[0, 0, 3] = -torch.inf  # a masked key
    x[1, 2, 0] = 8.0  # the row's maximum
    p, s = _p_fp16(x, block_n)
    want = torch.exp2(x.half().float()).half()
    assert torch.equal(p, want.float()) and p[0, 0, 3] == 0 and p[1, 2, 0] == 256
    assert torch.allclose(s, _kernel_row_sum(want, block_n), rtol=1e-6, atol=0)  # FP32 order aside
    # FP16's steps: P within 2^-8 relative of the FP32 exponential (argument rounding, |x| <= 16:
    # ln2 * 2^-8 / 2, and the result's 2^-11), the tile sum within 2^-7 of P's FP32 sum
    exact = torch.exp2(x)
    assert ((p - exact).abs() <= exact * 2**-8).all()
    assert ((s - exact.sum(-1, keepdim=True)).abs() <= exact.sum(-1, keepdim=True) * 2**-7).all()


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4qk_fp8pv"])
def test_p_fp16_forward_stays_near_the_recipe(recipe):
    """The option's reference forward against the recipe's: the same masks, rows without keys and
    non-finite pattern; the output within 1e-2 rel-L2 (a few % of P's E4M3 codes move by one step
    where FP16 crosses a rounding boundary) and the LSE within 4.5e-3 (P's FP16 error, <= 1.8e-3,
    and log2(24) tree roundings of 2^-11)."""
    rec = fa.get_recipe(recipe)
    q, k, v = make_qkv(1, 4, 2, 300, 200, 64)
    q_s, k_s = quantize_qk(q, k, rec)
    v_s = quantize_v(v, rec)
    kw = dict(causal=True, softmax_scale=64**-0.5, block_n=128, reverse_tiles=True)
    out, lse, _ = reference_forward_quantized(q_s, k_s, v_s, rec, **kw)
    out16, lse16, _ = reference_forward_quantized(q_s, k_s, v_s, rec, p_fp16=True, **kw)
    fin = torch.isfinite(lse)
    assert (~fin).any() and torch.equal(torch.isfinite(lse16), fin)
    assert torch.equal(out16[:, :, :100], out[:, :, :100])  # rows without keys: zeros
    assert rel_l2(out16, out) <= 1e-2
    assert (lse16[fin] - lse[fin]).abs().max() <= 4.5e-3


def test_p_fp16_refuses_other_p_formats():
    """BF16 and MXFP4 P, and tiles that are not a multiple of 8 keys (the kernel's row-sum words)."""
    q, k, v = make_qkv(1, 2, 1, 64, 64, 64)
    for name in ("bf16", "nvfp4qk_mxfp4pv_fast"):
        rec = fa.get_recipe(name)
        q_s, k_s = quantize_qk(q, k, rec)
        with pytest.raises(ValueError, match="p_fp16: for the FP8 P recipes"):
            reference_forward_quantized(
                q_s, k_s, quantize_v(v, rec), rec, causal=True, softmax_scale=0.1, p_fp16=True
            )
    rec = fa.get_recipe("fp8")
    q_s, k_s = quantize_qk(q, k, rec)
    with pytest.raises(ValueError, match="p_fp16: block_n must be a multiple of 8"):
        reference_forward_quantized(
            q_s, k_s, quantize_v(v, rec), rec, causal=True, softmax_scale=0.1, p_fp16=True, block_n=100
        )


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4qk_fp8pv"])
def test_p_fp16_backward_rebuilds_p_through_fp16(recipe):
    """``reference_backward(p_fp16=True)`` (the CuTe backward's ``exp_f16``): P^T = FP16(2^FP16(z +
    stat)) wherever the recipe's P is finite. dV, which reads P only through its E4M3 rounding, is
    checked against a dV computed from that rule directly; dQ/dK stay within 2e-2 rel-L2 of the
    recipe's (P's FP16 error, <= 2^-8 relative, against dS's BF16 rounding of 2^-9), and a zero dO
    still gives zero gradients."""
    from fp4_attention.numerics.reference import reference_backward

    rec = fa.get_recipe(recipe)
    q, k, v = make_qkv(1, 4, 2, 200, 200, 64)
    q_s, k_s = quantize_qk(q, k, rec)
    v_s = quantize_v(v, rec)
    kw = dict(causal=True, softmax_scale=64**-0.5)
    out, lse, state = reference_forward_quantized(q_s, k_s, v_s, rec, block_n=128, **kw)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).bfloat16()
    base = reference_backward(state, dout, rec, **kw)
    fp16 = reference_backward(state, dout, rec, p_fp16=True, **kw)
    for a, b in zip(fp16, base):
        assert torch.isfinite(a).all() and rel_l2(a, b) <= 2e-2
    assert not torch.equal(fp16[2], base[2])  # some P^T E4M3 code moved
    # with one KV tile (block_n >= Sk) the rule gives dV in one product: check it directly
    one = reference_backward(state, dout, rec, p_fp16=True, block_n=256, **kw)
    assert torch.equal(one[2], _dv_fp16_rule(state, dout, rec, 64**-0.5))
    zero = reference_backward(state, torch.zeros_like(dout), rec, p_fp16=True, **kw)
    assert all(torch.count_nonzero(g) == 0 for g in zero)


def _dv_fp16_rule(state, dout, rec, softmax_scale):
    """dV of one KV tile from P^T = FP16(2^FP16(z + stat)), written out: the reference's operands
    and dO rule, P rounded to E4M3 (2^-LIFT and V's scale in the epilogue)."""
    from fp4_attention.numerics.formats import round_e4m3
    from fp4_attention.numerics.operands import qk_operands, v_operand
    from fp4_attention.numerics.quant import quantize_fp8
    from fp4_attention.numerics.reference import LOG2E, _group, _scores_log2

    ops, vo = qk_operands(state.q, state.k, rec, softmax_scale), v_operand(state.v, rec)
    hkv, sq, sk = ops.k_op.shape[1], ops.q_op.shape[2], ops.k_op.shape[2]
    lift = float(rec.p_lift_log2)
    lse = _group(state.lse.unsqueeze(-1), hkv)
    stat = torch.where(torch.isinf(lse), torch.full_like(lse, -torch.inf), lift - lse * LOG2E)
    z = _scores_log2(ops, _group(ops.q_op, hkv), _group(ops.row_scale, hkv), 0, sk, True, sq, sk)
    p = torch.exp2((z + stat).half().float()).half().float()
    do_q = quantize_fp8(_group(dout.float(), hkv) * vo.v_scale.unsqueeze(2), "e5m2", dims=(-2, -1))
    dv = (torch.matmul(round_e4m3(p).transpose(-1, -2), do_q.data.float()) * do_q.scale).sum(2)
    return (dv * 2.0**-lift / vo.v_scale).bfloat16()
