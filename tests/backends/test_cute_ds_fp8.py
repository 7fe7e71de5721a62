"""The CuTe backward's ``ds_fp8`` measurement option (one E4M3 dS tile for dQ and dK, all five
products FP8 wgmma; ``numerics/ds_fp8.py``) against the reference backward with the same rounding
(``shared_tile_round``) and the same per-head scale (the operands' ``ds_scale``), on the CuTe
forward's state, at the shapes of test_cute_backend.py's ``test_matches_reference_shapes``, ragged
lengths and rows without keys. dV does not depend on dS: with one query head per KV head (no FP32
atomics for dK/dV) it equals the default kernel's bit for bit."""

import pytest
import torch

import fp4_attention as fa
from fp4_attention.numerics.ds_fp8 import shared_tile_round
from fp4_attention.numerics.operands import SavedState
from fp4_attention.numerics.reference import reference_backward

from ..conftest import make_qkv, rel_l2

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

from fp4_attention.backends.cute import backend as cute_backend  # noqa: E402

from .test_cute_backend import _target  # noqa: E402


def _compare(b, hq, hkv, sq, sk, d, causal, seed=0):
    rec = fa.get_recipe("fp8")
    target = _target(cute_backend.DEFAULT_TILES)
    q, k, v = make_qkv(b, hq, hkv, sq, sk, d, seed=seed, device="cuda")
    sm = d**-0.5
    out, lse, st = target.backend.forward(q, k, v, rec, causal=causal, softmax_scale=sm)
    _, _, rst = target.reference(st, rec, causal=causal, softmax_scale=sm, d=d)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).bfloat16().cuda()
    s = cute_backend.backward_operands(st, dout, sm, ds_fp8=True)["ds_scale"]
    got = cute_backend.backward_fp8(st, dout, causal=causal, softmax_scale=sm, ds_fp8=True)
    base = cute_backend.backward_fp8(st, dout, causal=causal, softmax_scale=sm)
    # the option's definition: one E4M3 tile of dS row col / s, the token scales on dS
    rounding = dict(
        ds_round=shared_tile_round(st.q.scale.squeeze(-1), st.k.scale.squeeze(-1), s), token_scales="ds"
    )
    ref_state = SavedState(q=rst.q, k=rst.k, v=rst.v, out=out, lse=lse)  # the kernel's own output and LSE
    ref = reference_backward(ref_state, dout, rec, causal=causal, softmax_scale=sm, **rounding)
    for name, g, r, g0 in zip("qkv", got, ref, base):
        assert torch.isfinite(g).all(), name
        # as test_cute_backend's gradients (the unpromoted FP8 QK's bound); an E4M3 rounding of T
        # that flips between kernel and reference (FP32 order of dS) moves one element by 2^-4
        assert rel_l2(g, r) <= 2e-2, (name, rel_l2(g, r))
        # and the option stays near the recipe's BF16-dS definition (3-5e-4 of cosine apart on
        # Gaussian inputs, results/ds_fp8_numerics_cpu.md)
        assert rel_l2(g, g0) <= 0.1, (name, rel_l2(g, g0))
    if hq == hkv:
        assert torch.equal(got[2], base[2])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 6])
def test_ds_fp8_matches_reference_shapes(causal, d, group):
    _compare(2, 2 * group, 2, 300, 300, d, causal)


@pytest.mark.parametrize("sq, sk", [(257, 1000), (600, 200), (129, 129)])
def test_ds_fp8_ragged_and_rows_without_keys(sq, sk):
    _compare(1, 4, 1, sq, sk, 128, True)


def test_ds_fp8_training_shape():
    _compare(1, 32, 8, 4096, 4096, 128, True)


def test_ds_fp8_needs_e4m3_qk():
    rec = fa.get_recipe("nvfp4qk_fp8pv")
    q, k, v = make_qkv(1, 4, 1, 128, 128, 128, device="cuda")
    _, _, st = cute_backend.CuteBackend().forward(q, k, v, rec, causal=True, softmax_scale=128**-0.5)
    with pytest.raises(ValueError, match="ds_fp8 needs the fp8 recipe"):
        cute_backend.backward_fp8(st, torch.randn_like(q), causal=True, softmax_scale=128**-0.5, ds_fp8=True)


def test_ds_fp8_through_the_api():
    """``fa.attention(..., backend="cute", ds_fp8=True)``: the option reaches the backward (its
    gradients are the option's, not the default's), and a recipe without E4M3 Q/K is refused before
    the forward runs."""
    q, k, v = make_qkv(1, 8, 2, 512, 512, 128, device="cuda")
    grads = []
    for opts in ({}, {"ds_fp8": True}):
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out = fa.attention(qg, kg, vg, recipe="fp8", causal=True, layout="bhsd", backend="cute", **opts)
        out.backward(torch.ones_like(out))
        grads.append((qg.grad, kg.grad, vg.grad))
    for name, g0, g1 in zip("qkv", *grads):
        assert torch.isfinite(g1).all(), name
        if name != "v":  # dV does not depend on dS
            assert not torch.equal(g0, g1) and rel_l2(g1, g0) <= 0.1, (name, rel_l2(g1, g0))
    with pytest.raises(ValueError, match="ds_fp8 .* needs E4M3 Q/K"):
        fa.attention(q, k, v, recipe="nvfp4qk_fp8pv", causal=True, layout="bhsd", backend="cute", ds_fp8=True)
