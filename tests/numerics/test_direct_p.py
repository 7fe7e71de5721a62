"""Direct-P (contract §2 "Direct-P"): classifier codes, represented normalization, invariances."""

import math

import pytest
import torch

import fp4_attention as fa
from fp4_attention.numerics.direct_p import LOG2_6, classifier_codes, ideal_codes, p_codes
from fp4_attention.numerics.operands import qk_operands, quantize_qk, quantize_v, v_operand
from fp4_attention.numerics.recipes import DirectP

from ..conftest import make_qkv, rel_l2

PROBS = [1.0, 2 / 3, 1 / 3, 1 / 6]


def _block(probs):
    """One 32-key block of scores in log2 units whose exponentials are ``probs`` (rest masked)."""
    z = torch.full((1, 1, 32), -torch.inf, dtype=torch.float64)
    z[0, 0, : len(probs)] = torch.log2(torch.tensor(probs, dtype=torch.float64))
    return z.float()


def test_worked_example_exact_path():
    q, e_b = p_codes(_block(PROBS), DirectP(exact_every=1), torch.arange(32).view(1, 32))
    assert e_b.item() == 0  # alpha_B = 1
    assert q[0, 0, :4].tolist() == [6, 4, 2, 1] and torch.all(q[0, 0, 4:] == 0)
    assert q.sum().item() / 6 == pytest.approx(13 / 6, rel=0, abs=1e-15)  # = 1 + 2/3 + 1/3 + 1/6


def test_classifier_a150_b120_by_hand():
    # x = log2(6 p): 2.585, 2, 1, 0 -> u = 1.5 x + 1.2 = 5.077, 4.2, 2.7, 1.2 -> E2M1 6, 4, 3, 1
    x = torch.tensor([math.log2(6.0), 2.0, 1.0, 0.0, -0.8, -2.0])
    assert classifier_codes(x, 1.5, 1.2).tolist() == [6, 4, 3, 1, 0, 0]  # u(-0.8)=0 -> 0, u(-2) clipped to 0
    q, _ = p_codes(_block(PROBS), DirectP(1.5, 1.2, 0), torch.arange(32).view(1, 32))
    assert q[0, 0, :4].tolist() == [6, 4, 3, 1]
    # the second published fit, A=1.60, B=0.95: u = 5.086, 4.15, 2.55, 0.95 -> 6, 4, 3, 1
    assert classifier_codes(x[:4], 1.6, 0.95).tolist() == [6, 4, 3, 1]


def test_accurate_routes_every_fourth_key_through_exp2():
    z = _block([1.0, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3])
    q, _ = p_codes(z, DirectP(1.5, 1.2, 4), torch.arange(32).view(1, 32))
    # 1/3 -> ideal 2 at keys 0 mod 4 (key 4), classifier 3 elsewhere
    assert q[0, 0, :6].tolist() == [6, 3, 3, 3, 2, 3]
    assert ideal_codes(torch.tensor([LOG2_6, 1.0])).tolist() == [6, 2]


def test_block_max_maps_into_3_6():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 4, 32, generator=g) * 5
    q, e_b = p_codes(z, DirectP(exact_every=1), torch.arange(128).view(4, 32))
    top = q.amax(-1)
    assert torch.all((top >= 3) & (top <= 6)) and torch.all(e_b == torch.ceil(z.amax(-1)))


def _direct_p_by_hand(q, k, v, recipe, causal):
    """Untiled float64 recomputation of the represented operator from the same codes."""
    qs, ks = quantize_qk(q, k, recipe)
    ops = qk_operands(qs, ks, recipe, q.shape[-1] ** -0.5)
    vo = v_operand(quantize_v(v, recipe), recipe)
    g = q.shape[1] // k.shape[1]
    z = (
        (ops.q_op @ ops.k_op.repeat_interleave(g, 1).transpose(-1, -2))
        * ops.row_scale
        * (ops.softmax_scale * 1.4426950408889634)
        * ops.col_scale.repeat_interleave(g, 1)
    )
    sq, sk = z.shape[-2:]
    if causal:
        vis = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
        z = z.masked_fill(~vis, -torch.inf)
    pad = (-sk) % 32
    z = torch.nn.functional.pad(z, (0, pad), value=-torch.inf)
    codes, e_b = p_codes(z.unflatten(-1, (-1, 32)), recipe.direct_p, torch.arange(sk + pad).view(-1, 32))
    w = (torch.exp2(e_b.double()).unsqueeze(-1) * codes.double() / 6).flatten(-2)  # represented weights
    denom = w.sum(-1, keepdim=True)
    out = (w @ (vo.v_op.double() / 6).repeat_interleave(g, 1)) / denom
    return out, torch.log(denom.squeeze(-1))


@pytest.mark.parametrize("recipe", ["nvfp4qk_mxfp4pv_fast", "nvfp4qk_mxfp4pv_accurate"])
@pytest.mark.parametrize("causal", [False, True])
def test_denominator_is_the_sum_of_consumed_weights(recipe, causal):
    """Contract §4 case 10: the weights PV consumed sum to the saved normalizer."""
    rec = fa.get_recipe(recipe)
    q, k, v = make_qkv(1, 4, 2, 70, 100, 64, seed=5)
    with torch.no_grad():
        out, lse = fa.attention(
            q, k, v, recipe=rec, causal=causal, layout="bhsd", return_lse=True, block_n=64
        )
    ref_out, ref_lse = _direct_p_by_hand(q, k, v, rec, causal)
    assert torch.allclose(lse.double(), ref_lse, rtol=0, atol=2e-6)
    assert rel_l2(out, ref_out) < 4e-3  # BF16 output rounding only


@pytest.mark.parametrize("recipe", ["nvfp4qk_mxfp4pv_fast", "nvfp4qk_mxfp4pv_accurate"])
def test_tile_size_invariance_is_exact_up_to_fp32_sums(recipe):
    """Contract §4 case 7: the integer anchor makes codes independent of the tiling."""
    q, k, v = make_qkv(1, 2, 1, 64, 300, 128, seed=6, scale=2.0)
    outs = []
    with torch.no_grad():
        for bn in (32, 96, 256, 512):
            outs.append(
                fa.attention(q, k, v, recipe=recipe, causal=True, layout="bhsd", return_lse=True, block_n=bn)
            )
    for o, lse in outs[1:]:
        assert (o.float() - outs[0][0].float()).abs().max() <= 2**-7 * outs[0][0].float().abs().max()
        assert torch.allclose(lse, outs[0][1], rtol=0, atol=1e-5)


def test_huge_logits_stay_finite():
    """Logits far above 88 (exp overflows FP32) are handled by the integer anchor."""
    q, k, v = make_qkv(1, 1, 1, 16, 64, 64, seed=7, scale=40.0)
    with torch.no_grad():
        out, lse = fa.attention(q, k, v, recipe="nvfp4qk_mxfp4pv_fast", layout="bhsd", return_lse=True)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all() and lse.max() > 500


def test_block_n_must_align_with_mx_blocks():
    q, k, v = make_qkv(1, 1, 1, 8, 64, 64)
    with pytest.raises(ValueError, match="multiple of 32"), torch.no_grad():
        fa.attention(q, k, v, recipe="nvfp4qk_mxfp4pv_fast", layout="bhsd", block_n=48)
