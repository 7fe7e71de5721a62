"""RoPE as ``fp4_attention`` defines it (``numerics/rope.py``): megatron-core's formula in FP32
rounded once to BF16, its transposed rotation as the gradient, the tables' validation, and
``attention(..., rope=...)`` equal to attention of the RoPE'd inputs, values and gradients, on
every training recipe and layout, through both interface paths (a backend without ``fused_rope``,
and one that declares it)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

import fp4_attention as fa
from fp4_attention import backends
from fp4_attention.backends import base
from fp4_attention.interface import LAYOUTS
from fp4_attention.numerics.rope import RoPETables, apply_rope, rope_grad, rope_tables
from tests.conftest import ReferenceBacked

D = 64


def _angles(s: int, d: int = D, scale: float = 1.0) -> torch.Tensor:
    inv = 500000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    return torch.arange(s, dtype=torch.float32)[:, None] * inv[None, :] * scale


def _x(shape, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 2).bfloat16()


def test_apply_rope_is_megatrons_fp32_formula_rounded_once():
    s = 300
    theta = _angles(s, scale=7.0)  # large angles: cos/sin of every sign and size
    x = _x((2, 3, s, D))
    freqs = torch.cat((theta, theta), dim=-1)[:, None, None, :]  # megatron-core's [s, 1, 1, D]
    # megatron-core's unfused RoPE on the FP32 values of x (its arithmetic in FP32), in its [s, b, h, d]
    theirs = _apply_rotary_pos_emb_bshd(x.float().permute(2, 0, 1, 3), freqs).permute(1, 2, 0, 3)
    ours = apply_rope(x, *rope_tables(theta))
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, theirs.bfloat16())


def test_rope_grad_is_the_transposed_rotation():
    s = 40
    cos, sin = rope_tables(_angles(s, scale=3.0))
    x = _x((1, 2, s, D), seed=1).float().requires_grad_()
    g = _x((1, 2, s, D), seed=2)
    # the rotation in FP32 without the final rounding: autograd's gradient is R^T g
    h = D // 2
    y = torch.cat((x[..., :h] * cos - x[..., h:] * sin, x[..., h:] * cos + x[..., :h] * sin), -1)
    (want,) = torch.autograd.grad(y, x, g.float())
    assert torch.equal(rope_grad(g, cos, sin), want.bfloat16())
    # R is orthogonal: R^T R x = x up to the two BF16 roundings
    back = rope_grad(apply_rope(x.detach(), cos, sin), cos, sin).float()
    torch.testing.assert_close(back, x.detach().bfloat16().float(), rtol=2**-7, atol=2**-7)


def test_tables_are_checked():
    theta = _angles(16)
    r = RoPETables.from_angles(theta)
    assert r.cos_k is r.cos_q and r.cos_q.shape == (16, D // 2) and r.cos_q.dtype == torch.float32
    r.check(16, 16, D, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"must be \[seq, head_dim / 2\] = \[17, 32\]"):
        r.check(17, 16, D, torch.device("cpu"))
    with pytest.raises(ValueError, match="head dim must be even"):
        r.check(16, 16, 63, torch.device("cpu"))
    with pytest.raises(TypeError, match="must be FP32 angles"):
        RoPETables.from_angles(theta.bfloat16())
    with pytest.raises(ValueError, match=r"2-D \[seq, head_dim / 2\]"):
        RoPETables.from_angles(theta[:, None, None, :])
    with pytest.raises(ValueError, match="one head dim, got 64 and 32"):
        RoPETables.from_angles(theta, theta[:, :16])
    q = _x((1, 16, 2, D))
    with pytest.raises(TypeError, match="rope must be an fp4_attention.RoPETables"):
        fa.attention(q, q, q, recipe="bf16", rope=(r.cos_q, r.sin_q))
    not_contig = dataclasses.replace(r, cos_q=r.cos_q.t().contiguous().t())
    with pytest.raises(ValueError, match="must be contiguous"):
        fa.attention(q, q, q, recipe="bf16", rope=not_contig)


def _via_rope_first(q, k, v, rope, layout, **kw):
    """attention of apply_rope(q), apply_rope(k): the definition ``rope=`` must equal."""
    perm = LAYOUTS[layout]
    inv = [perm.index(i) for i in range(4)]
    qr = apply_rope(q.permute(*perm), rope.cos_q, rope.sin_q).permute(*inv)
    kr = apply_rope(k.permute(*perm), rope.cos_k, rope.sin_k).permute(*inv)
    return fa.attention(qr, kr, v, layout=layout, **kw)


def _case(layout: str, sq=48, sk=48, seed=0):
    b, hq, hkv = 2, 4, 2
    shapes = {
        "bshd": ((b, sq, hq, D), (b, sk, hkv, D)),
        "bhsd": ((b, hq, sq, D), (b, hkv, sk, D)),
        "sbhd": ((sq, b, hq, D), (sk, b, hkv, D)),
    }[layout]
    q, k, v = _x(shapes[0], seed), _x(shapes[1], seed + 1), _x(shapes[1], seed + 2)
    return [t.requires_grad_() for t in (q, k, v)]


def _grads(out, inputs, seed=9):
    g = torch.Generator().manual_seed(seed)
    return torch.autograd.grad(out, inputs, torch.randn(out.shape, generator=g).bfloat16())


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("recipe", fa.TRAINING_RECIPES)
def test_attention_with_rope_equals_attention_of_roped_inputs(recipe, layout):
    q, k, v = _case(layout)
    rope = RoPETables.from_angles(_angles(48, scale=5.0))
    kw = dict(recipe=recipe, causal=True, backend="reference")
    out = fa.attention(q, k, v, rope=rope, layout=layout, **kw)
    want = _via_rope_first(q, k, v, rope, layout, **kw)
    assert torch.equal(out, want)
    for a, b in zip(_grads(out, (q, k, v)), _grads(want, (q, k, v))):
        assert torch.equal(a, b)
    with torch.no_grad():
        assert torch.equal(fa.attention(q, k, v, rope=rope, layout=layout, **kw), out)


def test_rope_pass_with_one_input_needing_a_gradient(monkeypatch):
    # the reference backend takes RoPE as its own pass (RoPEFunction over Q and K): a K without
    # requires_grad gets an output without one, its gradient is neither asked for nor rotated, and
    # Q's gradient is the one of the call where both need one
    from fp4_attention.backends import rope as rope_ops

    q, k, v = _case("bshd")
    rope = RoPETables.from_angles(_angles(48, scale=5.0))
    kw = dict(recipe="fp8", causal=True, backend="reference")
    dq_both = _grads(fa.attention(q, k, v, rope=rope, **kw), (q,))[0]
    calls = []
    real = rope_ops.rope_pair_op

    def recorded(a, b, tables, *, grad=False):
        calls.append((grad, a is None, b is None))
        return real(a, b, tables, grad=grad)

    monkeypatch.setattr(rope_ops, "rope_pair_op", recorded)
    q_only = q.detach().requires_grad_()
    qr, kr = rope_ops.RoPEFunction.apply(q_only.transpose(1, 2), k.detach().transpose(1, 2), rope)
    assert qr.requires_grad and not kr.requires_grad
    out = fa.attention(q_only, k.detach(), v.detach(), rope=rope, **kw)
    assert torch.equal(_grads(out, (q_only,))[0], dq_both)
    assert calls[-1] == (True, False, True)  # the backward: dQ rotated, no dK asked for


def test_rope_of_other_positions_for_k():
    q, k, v = _case("bshd", sq=16, sk=48)
    theta = _angles(48, scale=2.0)
    rope = RoPETables.from_angles(theta[32:], theta)  # the last 16 positions query all 48 keys
    kw = dict(recipe="fp8", causal=True, backend="reference")
    out = fa.attention(q, k, v, rope=rope, **kw)
    assert torch.equal(out, _via_rope_first(q, k, v, rope, "bshd", **kw))
    with pytest.raises(ValueError, match=r"rope.cos_q must be \[seq, head_dim / 2\] = \[16, 32\]"):
        fa.attention(q, k, v, rope=RoPETables.from_angles(theta), **kw)


class _FusedRopeReference(ReferenceBacked):
    """A test backend that declares ``fused_rope``: it applies RoPE itself and returns the
    gradients of the RoPE'd Q/K, which the interface must rotate back."""

    calls: list = []

    def forward(self, q, k, v, recipe, *, causal, softmax_scale, rope=None):
        self.calls.append(rope)
        if rope is not None:
            q, k = apply_rope(q, rope.cos_q, rope.sin_q), apply_rope(k, rope.cos_k, rope.sin_k)
        return super().forward(q, k, v, recipe, causal=causal, softmax_scale=softmax_scale)


def test_a_fused_rope_backend_gets_the_tables_and_its_gradients_are_rotated_back():
    spec = dataclasses.replace(
        fa.backend_spec("reference"), name="fused-rope-test", impl="", fused_rope=True, priority=-1
    )
    backend = _FusedRopeReference(spec)
    fa.register_backend(backend, replace=True)
    try:
        q, k, v = _case("sbhd")
        rope = RoPETables.from_angles(_angles(48, scale=5.0))
        kw = dict(recipe="fp8", causal=True)
        out = fa.attention(q, k, v, rope=rope, backend="fused-rope-test", layout="sbhd", **kw)
        got_grads = _grads(out, (q, k, v))
        # only q needs a gradient: K's is neither rotated back nor returned
        q_only = q.detach().requires_grad_()
        out_q = fa.attention(
            q_only, k.detach(), v.detach(), rope=rope, backend="fused-rope-test", layout="sbhd", **kw
        )
        (dq_only,) = _grads(out_q, (q_only,))
    finally:
        backends._SPECS.pop("fused-rope-test")
        backends._INSTANCES.pop("fused-rope-test")
    assert backend.calls[-1] is rope  # the tables reached the backend, not RoPE'd inputs
    want = _via_rope_first(q, k, v, rope, "sbhd", backend="reference", **kw)
    assert torch.equal(out, want)
    for a, b in zip(got_grads, _grads(want, (q, k, v))):
        assert torch.equal(a, b)
    assert torch.equal(dq_only, got_grads[0])
    assert not base.BackendSpec(name="x", impl="", recipes=()).fused_rope  # off unless declared
