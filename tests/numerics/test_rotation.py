"""The Q/K rotation (``numerics/rotation.py``): its definition, its exact FP32 arithmetic, the
reference's forward and backward with it, and the recipe/option validation."""

import dataclasses

import numpy as np
import pytest
import torch

import fp4_attention as fa
from fp4_attention.numerics.exact import naive_attention
from fp4_attention.numerics.operands import qk_operands, quantize_qk, quantize_v, v_operand
from fp4_attention.numerics.quant import nvfp4_global_scale, quantize_fp8, quantize_nvfp4
from fp4_attention.numerics.recipes import ROTATION_RECIPES, QKRotation, with_qk_rotation
from fp4_attention.numerics.rotation import (
    check_rotation_head_dim,
    fwht,
    hadamard_signs,
    inv_sqrt_dim,
    rotate,
    signs_text,
    unrotate,
)

from ..conftest import cosine, make_qkv, rel_l2


def _sylvester(d: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def _h_matrix(seed: int, d: int) -> torch.Tensor:
    """H = diag(s) Had / sqrt(D) in float64, built from its definition (no butterfly)."""
    s = hadamard_signs(seed, d).double()
    return s[:, None] * _sylvester(d) / d**0.5


@pytest.mark.parametrize("d", [16, 64, 128, 256])
def test_fwht_is_the_sylvester_hadamard_product(d):
    x = torch.randn(5, d, dtype=torch.float64, generator=torch.Generator().manual_seed(d))
    assert torch.allclose(fwht(x), x @ _sylvester(d), rtol=0, atol=1e-12)


@pytest.mark.parametrize("d", [16, 64, 128])
def test_rotation_is_orthogonal_and_rotate_matches_x_h(d):
    h = _h_matrix(5, d)
    assert torch.allclose(h @ h.T, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)
    x = torch.randn(7, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    s = hadamard_signs(5, d)
    assert torch.allclose(rotate(x, s), x @ h, rtol=0, atol=1e-12)
    assert torch.allclose(unrotate(x, s), x @ h.T, rtol=0, atol=1e-12)
    # FP32: rotate then unrotate is the identity up to FP32 rounding (log2(D) + 2 roundings)
    xb = x.bfloat16()
    back = unrotate(rotate(xb, s), s)
    assert back.dtype == torch.float32
    assert (back - xb.float()).abs().max() <= 16 * 2**-24 * xb.float().abs().max() * d**0.5


def test_scores_are_invariant_in_float64():
    q, k, _ = make_qkv(2, 4, 2, 33, 40, 128, seed=2)
    s = hadamard_signs(11, 128)
    qd, kd = q.double(), k.double()
    exact = qd @ kd.repeat_interleave(2, 1).transpose(-1, -2)
    rotated = rotate(qd, s) @ rotate(kd, s).repeat_interleave(2, 1).transpose(-1, -2)
    assert torch.allclose(rotated, exact, rtol=0, atol=1e-10 * exact.abs().max())


def _butterfly_numpy(x: np.ndarray, order) -> np.ndarray:
    """The butterfly written out element by element in float32, stages in ``order``."""
    x = x.astype(np.float32).copy()
    d = x.shape[-1]
    for h in order:
        for i in range(0, d, 2 * h):
            for j in range(i, i + h):
                a, b = x[..., j].copy(), x[..., j + h].copy()
                x[..., j], x[..., j + h] = a + b, a - b
    return x


def test_fp32_rotation_is_the_fixed_stage_butterfly_to_the_bit():
    """rotate() = FWHT(x * s) with stages h = 1, 2, ..., D/2, then one multiply by fp32(D^-1/2):
    bit-equal to an element-by-element float32 butterfly in that order. Another stage order gives
    other FP32 bits, which is why the order is part of the definition (a kernel must follow it).
    (BF16 inputs of one magnitude sum exactly in FP32 in any order; a wide range makes them round.)"""
    d = 64
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(9, d, generator=g) * torch.exp(4 * torch.randn(9, d, generator=g))).bfloat16()
    s = hadamard_signs(2, d)
    xs = (x.float() * s).numpy()
    up = _butterfly_numpy(xs, [1, 2, 4, 8, 16, 32]) * np.float32(inv_sqrt_dim(d))
    got = rotate(x, s)
    assert got.dtype == torch.float32
    assert np.array_equal(got.numpy().view(np.int32), up.view(np.int32))
    down = _butterfly_numpy(xs, [32, 16, 8, 4, 2, 1]) * np.float32(inv_sqrt_dim(d))
    assert not np.array_equal(up.view(np.int32), down.view(np.int32))
    assert inv_sqrt_dim(128) == float(np.float32(128**-0.5)) and inv_sqrt_dim(64) == 0.125


def test_signs_are_a_deterministic_function_of_the_seed():
    a, b = hadamard_signs(7, 128), hadamard_signs(7, 128)
    assert torch.equal(a, b) and a.dtype == torch.float32 and set(a.tolist()) == {1.0, -1.0}
    assert not torch.equal(hadamard_signs(8, 128), a)
    # pinned: torch's CPU generator for these seeds (a change would change H under resumed runs,
    # which the resolved config's qk_rotation_signs then refuses)
    assert signs_text(0, 16) == "+--+-------++-++"
    assert signs_text(1, 16) == "--++-----++-+--+"
    assert signs_text(7, 128) == "".join("+" if v > 0 else "-" for v in a.tolist())
    # the copy handed out cannot change the cached vector
    a.neg_()
    assert torch.equal(hadamard_signs(7, 128), b)


def test_rotation_backward_is_the_adjoint():
    """autograd of the float64 definition x -> x H is g -> g H^T = unrotate(g)."""
    x = torch.randn(3, 5, 64, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 5, 64, dtype=torch.float64)
    s = hadamard_signs(4, 64)
    (grad,) = torch.autograd.grad((rotate(x, s) * g).sum(), x)
    assert torch.allclose(grad, unrotate(g, s), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ROTATION_RECIPES)
def test_quantizers_see_the_fp32_rotated_values(name):
    """Q/K are rotated in FP32 and quantized from FP32 (no BF16 rounding in between)."""
    rec = with_qk_rotation(name, "hadamard", 9)
    q, k, _ = make_qkv(1, 2, 1, 64, 64, 128, seed=4)
    qs, ks = quantize_qk(q, k, rec)
    s = hadamard_signs(9, 128)
    qr, kr = rotate(q, s), rotate(k, s)
    if rec.qk == "fp8":
        want = quantize_fp8(qr, "e4m3", dims=(-1,))
        assert torch.equal(qs.data.view(torch.uint8), want.data.view(torch.uint8))
        assert torch.equal(qs.scale, want.scale)
    else:
        want = quantize_nvfp4(kr, nvfp4_global_scale(kr, dims=(2, 3)))
        assert torch.equal(ks.payload, want.payload) and torch.equal(ks.block_scale, want.block_scale)
        assert torch.equal(ks.global_scale, want.global_scale)
        rounded = quantize_nvfp4(qr.bfloat16(), nvfp4_global_scale(qr.bfloat16(), dims=(2, 3)))
        assert not torch.equal(qs.payload, rounded.payload)  # the BF16 rounding would change codes


def _ste_rotated(q, k, v, rec, dout):
    """float64 autograd of the definition: x -> x H (float64), straight through the recipe's
    quantization of Q H, K H and V, then float64 attention."""
    qs, ks = quantize_qk(q, k, rec)
    ops = qk_operands(qs, ks, rec, q.shape[-1] ** -0.5)
    vo = v_operand(quantize_v(v, rec), rec)
    col = ops.col_scale if rec.qk == "nvfp4" else ops.col_scale.transpose(-1, -2)
    qhat, khat = (ops.q_op * ops.row_scale).double(), (ops.k_op * col).double()
    s = rec.qk_rotation.signs(q.shape[-1]).double()
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    qr, kr = rotate(q64, s), rotate(k64, s)
    qste, kste = qr + (qhat - qr).detach(), kr + (khat - kr).detach()
    vste = v64 + ((vo.v_op * vo.v_scale).double() - v64).detach()
    out, _ = naive_attention(qste, kste, vste, causal=True, softmax_scale=q.shape[-1] ** -0.5)
    out.backward(dout.double())
    return out.detach(), (q64.grad, k64.grad, v64.grad)


@pytest.mark.parametrize("name", ROTATION_RECIPES)
def test_reference_backward_matches_autograd_of_the_definition(name):
    """Forward and gradients of the rotated recipe equal float64 autograd through the rotation and
    the dequantized operands, within the rounding of E4M3 P and E5M2 dO (the bounds of
    test_reference.test_quantized_gradients_are_straight_through; measured rel-L2 0.04-0.05)."""
    rec = with_qk_rotation(name, "hadamard", 7)
    q, k, v = make_qkv(1, 4, 2, 160, 160, 128, seed=5)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(6)).bfloat16()
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    out = fa.attention(qq, kk, vv, recipe=rec, causal=True, layout="bhsd")
    out.backward(dout)
    ref, ref_grads = _ste_rotated(q, k, v, rec, dout)
    assert rel_l2(out, ref) < 0.04
    for g, rg in zip((qq.grad, kk.grad, vv.grad), ref_grads):
        assert rel_l2(g, rg) < 0.09 and cosine(g, rg) > 0.995
    # without the un-rotation dQ would be the rotated basis's, dQ H: far from the gradient
    assert cosine(rotate(qq.grad, rec.qk_rotation.signs(128)), ref_grads[0]) < 0.5


def test_function_and_module_take_the_option():
    q, k, v = make_qkv(1, 4, 1, 32, 32, 64, seed=8)
    a = fa.attention(
        q, k, v, recipe="nvfp4qk_fp8pv", layout="bhsd", qk_rotation="hadamard", qk_rotation_seed=3
    )
    rec = with_qk_rotation("nvfp4qk_fp8pv", "hadamard", 3)
    assert torch.equal(a, fa.attention(q, k, v, recipe=rec, layout="bhsd"))
    plain = fa.attention(q, k, v, recipe="nvfp4qk_fp8pv", layout="bhsd")
    assert not torch.equal(a, plain)
    assert torch.equal(plain, fa.attention(q, k, v, recipe=rec, layout="bhsd", qk_rotation="none"))
    layer = fa.FP4Attention(
        "nvfp4qk_fp8pv", causal=False, layout="bhsd", qk_rotation="hadamard", qk_rotation_seed=3
    )
    assert torch.equal(layer(q, k, v), a) and "nvfp4qk_fp8pv+hadamard(seed 3)" in repr(layer)
    assert fa.FP4Attention(rec, layout="bhsd").recipe == rec


@pytest.mark.parametrize(
    "call, match",
    [
        (dict(recipe="bf16", qk_rotation="hadamard"), "applies to the training recipes with quantized Q/K"),
        (dict(recipe="nvfp4qk_mxfp4pv_fast", qk_rotation="hadamard"), "not 'nvfp4qk_mxfp4pv_fast'"),
        (
            dict(recipe="fp8", qk_rotation="walsh"),
            "qk_rotation='walsh' is unknown; choose one of none, hadamard",
        ),
        (dict(recipe="fp8", qk_rotation="hadamard", qk_rotation_seed=-1), r"integer in \[0, 2\^63\)"),
        (dict(recipe="fp8", qk_rotation="hadamard", qk_rotation_seed=True), "integer"),
        (dict(recipe="fp8", qk_rotation="hadamard", qk_rotation_seed=2**63), "integer"),
        (dict(recipe="fp8", qk_rotation_seed=5), "needs qk_rotation='hadamard'"),
        (dict(recipe="fp8", qk_rotation="none", qk_rotation_seed=5), "has no effect with qk_rotation='none'"),
    ],
)
def test_bad_options_raise(call, match):
    q, k, v = make_qkv(1, 2, 1, 16, 16, 64)
    with pytest.raises(ValueError, match=match):
        fa.attention(q, k, v, layout="bhsd", **call)


def test_head_dim_must_be_a_power_of_two():
    q, k, v = make_qkv(1, 2, 1, 16, 16, 48)
    with pytest.raises(ValueError, match="power of two .* got 48"):
        fa.attention(q, k, v, recipe="fp8", layout="bhsd", qk_rotation="hadamard")
    fa.attention(q, k, v, recipe="fp8", layout="bhsd")  # fine without the rotation
    for d in (0, 1, 48, 96, 160):
        with pytest.raises(ValueError, match="power of two"):
            check_rotation_head_dim(d)
    with pytest.raises(ValueError, match="a Q/K rotation needs quantized Q/K"):
        dataclasses.replace(fa.get_recipe("bf16"), qk_rotation=QKRotation())


def test_backends_without_the_rotation_are_refused_and_passed_over():
    rec = with_qk_rotation("fp8", "hadamard", 0)
    with pytest.raises(fa.UnsupportedError, match="cute backend does not implement qk_rotation='hadamard'"):
        fa.backends.check_supported("cute", rec, torch.zeros(1, 1, 4, 64))
    # auto: cute (the highest priority for fp8) runs fp8 but not its rotation; the ranking skips it
    assert fa.backends.alternatives(rec) == ["triton", "reference"]
    assert fa.backends.alternatives("fp8") == ["cute", "triton", "reference"]
    assert fa.resolve_backend("auto", rec, "cpu")[0] == "reference"
