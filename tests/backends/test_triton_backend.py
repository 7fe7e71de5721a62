"""Triton backend vs the torch reference on identical quantized inputs (contract §4 at
real sizes). The kernel's own quantized Q/K/V (whose bytes equal the reference quantizers', see
test_triton_quant.py) feed the reference's attention math, forward and backward.

Tolerances, and why: the kernel and the reference read identical quantized operands and both
accumulate in FP32, so they differ by accumulation order (~1e-6 relative on S and O) and, through
it, by E4M3 rounding of the few P values within an ulp of a rounding boundary (one E4M3 step is
6.25%; a handful of such flips per row moves O by ~1e-3 relative). Bounds: forward rel-L2 <= 5e-3
(BF16 output rounding alone is ~2e-3), LSE abs <= 1e-4; gradients rel-L2 <= 1e-2 (BF16 dS and
output rounding ~4e-3).
"""

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import fp4_attention as fa
from fp4_attention.numerics.exact import naive_attention
from fp4_attention.numerics.operands import SavedState
from fp4_attention.numerics.quant import FP8Tensor
from fp4_attention.numerics.recipes import with_k_scale_keys
from fp4_attention.numerics.reference import reference_backward, reference_forward_quantized

from ..conftest import cosine, make_qkv, rel_l2

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from fp4_attention.backends.triton import backend as triton_backend  # noqa: E402

BE = triton_backend.TritonBackend()
TRAIN = list(fa.TRAINING_RECIPES)


def _untransposed_v(state):
    """The Triton state stores V8 as [B, Hkv, D, Sk]; the reference reads [B, Hkv, Sk, D]."""
    v_s = state.v
    if isinstance(v_s, FP8Tensor):
        return FP8Tensor(data=v_s.data.transpose(-1, -2), scale=v_s.scale)
    return v_s


@dataclass(frozen=True)
class Target:
    """A backend under test and how the reference must run to compare with it rounding for
    rounding: its KV tile (``block_n``; FP8 P is rounded against its tile's running max), its tile
    order, and the saved V put in the reference's ``[B, Hkv, Sk, D]`` key order."""

    backend: object
    block_n: Callable[[int], int]
    reverse_tiles: bool = False
    reference_v: Callable = _untransposed_v
    # keyword options of reference_backward that the backend's backward implements (pairs: frozen)
    reference_backward_options: tuple = ()

    def reference(self, state, recipe, *, causal, softmax_scale, d):
        return reference_forward_quantized(
            state.q,
            state.k,
            self.reference_v(state),
            recipe,
            causal=causal,
            softmax_scale=softmax_scale,
            block_n=self.block_n(d),
            reverse_tiles=self.reverse_tiles,
        )


TRITON = Target(BE, triton_backend.default_block_n)


def compare(recipe, b, hq, hkv, sq, sk, d, causal, seed=0, scale=1.0, grads=True, target=TRITON, dlse=False):
    """Forward and (``grads``) backward of ``target`` against the reference on the same quantized
    state; ``dlse``: the backward also gets a gradient of the LSE (N(0, 1), FP32 ``[B, Hq, Sq]``),
    as a loss on ``attention(..., return_lse=True)``'s LSE gives it."""
    rec = fa.get_recipe(recipe)
    q, k, v = make_qkv(b, hq, hkv, sq, sk, d, seed=seed, scale=scale, device="cuda")
    sm = d**-0.5
    out, lse, st = target.backend.forward(q, k, v, rec, causal=causal, softmax_scale=sm)
    rout, rlse, rst = target.reference(st, rec, causal=causal, softmax_scale=sm, d=d)
    assert torch.isfinite(out).all()
    # FP8 QK (the recipe's definition: not promoted): Hopper's FP8 MMA adds the head dim's products
    # with a narrower accumulator, at most 2^-10.9 of sum_d |q8 k8| (2^-13.7 promoted after every
    # k32; results/robustness_h200/qk_accumulation_h200.md), an error relative to the score
    # magnitude, which grows as scale^2. With promotion the LSE differed by 1.3e-4 at scale 1,
    # 1.4e-3 at 2, 3.1e-3 at 3 and the bound was 5e-4 scale^2; without it the accumulator's error is
    # 2^(13.7 - 10.9) = 7x larger, and so are the bounds: 3.5e-3 scale^2 for the LSE, and for the
    # output and the gradients (which the exact-QK reference does not share) 1e-2 / 2e-2 x scale,
    # twice the promoted kernel's 5e-3 / 1e-2 (its distance from the promoted kernel measured 0.004
    # at scale 1). BF16 QK matches to ~1e-6.
    fp8_qk = rec.qk == "fp8"
    tol_out = 1e-2 * scale if fp8_qk else 5e-3
    assert rel_l2(out, rout) <= tol_out, (recipe, rel_l2(out, rout))
    fin = torch.isfinite(rlse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - rlse[fin]).abs().max() <= (3.5e-3 * scale**2 if fp8_qk else 1e-4)
    if not grads:
        return
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).bfloat16().cuda()
    lse_grad = {}
    if dlse:
        lse_grad["dlse"] = torch.randn(lse.shape, generator=torch.Generator().manual_seed(seed + 2)).cuda()
    got = target.backend.backward(st, dout, rec, causal=causal, softmax_scale=sm, **lse_grad)
    # the reference backward reads the kernel's own forward output and LSE (identical inputs)
    ref = reference_backward(
        SavedState(q=rst.q, k=rst.k, v=rst.v, out=out, lse=lse),
        dout,
        rec,
        causal=causal,
        softmax_scale=sm,
        **dict(target.reference_backward_options),
        **lse_grad,
    )
    for name, g, r in zip("qkv", got, ref):
        assert torch.isfinite(g).all()
        assert rel_l2(g, r) <= (2e-2 * scale if fp8_qk else 1e-2), (recipe, name, rel_l2(g, r))


@pytest.mark.parametrize("recipe", TRAIN)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 6])
def test_matches_reference_shapes(recipe, causal, d, group):
    compare(recipe, 2, 2 * group, 2, 300, 300, d, causal)


@pytest.mark.parametrize("recipe", TRAIN)
@pytest.mark.parametrize("n", [127, 128, 129, 255, 256, 257])
def test_tile_boundaries(recipe, n):
    compare(recipe, 1, 4, 1, n, n, 128, True)
    compare(recipe, 1, 4, 1, n // 2 + 1, n, 128, True)  # q_len < kv_len, bottom-right
    compare(recipe, 1, 4, 1, n, n // 2 + 1, 128, True)  # q_len > kv_len: rows without keys


@pytest.mark.parametrize("recipe", TRAIN)
def test_real_training_shape(recipe):
    compare(recipe, 1, 32, 8, 4096, 4096, 128, True)


@pytest.mark.parametrize("recipe", TRAIN)
@pytest.mark.parametrize("scale", [2.0, 3.0])
def test_wide_logits(recipe, scale):
    compare(recipe, 1, 8, 2, 1024, 1024, 128, True, scale=scale)


@pytest.mark.parametrize("recipe", TRAIN)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 4])
def test_lse_gradient_matches_reference(recipe, causal, group):
    """The LSE's gradient (``D - dlse``, ``reference_backward``'s rule) on the same state as the
    reference, D 64/128, with rows without keys (Sq > Sk, causal) and a ragged tile."""
    compare(recipe, 2, 2 * group, 2, 300, 300, 128, causal, dlse=True)
    compare(recipe, 1, 2 * group, 2, 257, 129, 64, causal, dlse=True)


def check_lse_gradient_through_the_api(backend: str, recipe: str):
    """A loss on the output and the LSE, and on the LSE alone, through ``fa.attention``, against
    float64 autograd (``tests/test_interface.py``'s ``lse_loss_cosines``, at a GPU size): each
    gradient's cosine within 1e-3 of the reference backend's on the same inputs (the recipe's own
    error sets the level: nvfp4qk_fp8pv's dQ is at 0.982 here on the CPU, fp8's at 0.9986); only the
    LSE in the loss gives no dV."""
    from ..test_interface import lse_loss_cosines

    shape = (1, 8, 2, 512, 512, 128)
    for out_in_loss in (True, False):
        got = lse_loss_cosines(backend, recipe, "cuda", shape, out_in_loss=out_in_loss)
        ref = lse_loss_cosines("reference", recipe, "cpu", shape, out_in_loss=out_in_loss)
        for name, c_got, c_ref in zip("qkv", got, ref):
            assert c_ref >= 0.98 and c_got >= c_ref - 1e-3, (backend, recipe, out_in_loss, name, c_got, c_ref)


@pytest.mark.parametrize("recipe", TRAIN)
def test_lse_gradient_through_the_api(recipe):
    check_lse_gradient_through_the_api("triton", recipe)


@pytest.mark.parametrize("recipe", TRAIN)
def test_attention_merged_by_lse_trains_like_the_whole(recipe):
    from ..test_interface import check_lse_merge

    check_lse_merge("triton", recipe, "cuda", shape=(1, 8, 2, 512, 512, 128))


@pytest.mark.parametrize("causal", [False, True])
def test_k_scale_keys_matches_reference(causal):
    """``fp8`` with ``k_scale_keys=64`` (K quantized per 64 keys by the Triton group quantizer, whose
    bytes test_triton_quant.py checks; the kernels read the scale repeated per key): forward and
    backward against the reference on the same state; the saved K scale is constant over each 64
    keys."""
    rec = with_k_scale_keys("fp8", 64)
    for b, hq, hkv, sq, sk in ((2, 8, 2, 300, 300), (1, 4, 1, 257, 1000), (1, 4, 1, 600, 200)):
        compare(rec, b, hq, hkv, sq, sk, 128, causal)
    q, k, v = make_qkv(1, 4, 1, 200, 200, 128, device="cuda")
    _, _, st = BE.forward(q, k, v, rec, causal=True, softmax_scale=128**-0.5)
    sc = st.k.scale[0, 0, :, 0]
    assert torch.equal(sc[:64], sc[:1].expand(64)) and not torch.equal(sc[:64], sc[64:128])


def check_zero_dout_exact_zero(recipe, target=TRITON):
    rec = fa.get_recipe(recipe)
    q, k, v = make_qkv(1, 8, 2, 512, 512, 128, device="cuda")
    out, lse, st = target.backend.forward(q, k, v, rec, causal=True, softmax_scale=128**-0.5)
    grads = target.backend.backward(st, torch.zeros_like(out), rec, causal=True, softmax_scale=128**-0.5)
    assert all(torch.count_nonzero(g) == 0 for g in grads)


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4qk_fp8pv"])
def test_zero_dout_exact_zero(recipe):
    check_zero_dout_exact_zero(recipe)


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4qk_fp8pv"])
def test_long_kv_no_drift(recipe):
    """Contract §4 case 8 at 128K keys: kernel vs reference on identical operands."""
    compare(recipe, 1, 2, 1, 256, 131072, 128, False, grads=False)


def check_token_scale_placement(recipe, target=TRITON):
    """The backward places the Q/K token scales as the recipe defines them (``reference_backward``'s
    ``token_scales``: in the BF16 operands for ``fp8``, on dS for ``nvfp4qk_fp8pv``). The two
    placements differ by BF16 roundings, below the kernel's own distance from the exact-QK reference
    (its unpromoted QK accumulation), so a tolerance cannot tell them apart; the projection of
    ``got - ref_ds`` on ``ref_operands - ref_ds`` can: 1 for the operands placement, 0 for dS (the
    kernel's other differences are uncorrelated with that direction; with 4e-3 relative Gaussian
    noise added to the reference's own gradients the coefficient stayed within 5e-3 of 0 and 1)."""
    rec = fa.get_recipe(recipe)
    q, k, v = make_qkv(1, 8, 2, 512, 512, 128, seed=3, device="cuda")
    sm = 128**-0.5
    out, lse, st = target.backend.forward(q, k, v, rec, causal=True, softmax_scale=sm)
    _, _, rst = target.reference(st, rec, causal=True, softmax_scale=sm, d=128)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).bfloat16().cuda()
    got = target.backend.backward(st, dout, rec, causal=True, softmax_scale=sm)
    state = SavedState(q=rst.q, k=rst.k, v=rst.v, out=out, lse=lse)
    ref = {
        ts: reference_backward(state, dout, rec, causal=True, softmax_scale=sm, token_scales=ts)
        for ts in ("ds", "operands")
    }
    want = 1.0 if rec.qk == "fp8" else 0.0
    for name, g, a, b in zip("qk", got, ref["ds"], ref["operands"]):
        d = b.float() - a.float()
        assert d.any(), name
        coef = float(((g.float() - a.float()) * d).sum() / (d * d).sum())
        assert abs(coef - want) < 0.2, (recipe, name, coef)


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4qk_fp8pv"])
def test_token_scale_placement(recipe):
    check_token_scale_placement(recipe)


def check_per_head_scales_matter(recipe, target=TRITON):
    """Contract §4 case 5 at a real size: per-(batch, kv-head) magnitudes 1e-2..1e2."""
    rec = fa.get_recipe(recipe)
    q, k, v = make_qkv(2, 8, 2, 512, 512, 128, seed=3, device="cuda")
    mags = torch.tensor([[0.01, 3.0], [100.0, 0.3]], device="cuda")
    k = (k.float() * mags[:, :, None, None]).bfloat16()
    v = (v.float() * mags.flip(0)[:, :, None, None]).bfloat16()
    q = (q.float() / mags.repeat_interleave(4, 1)[:, :, None, None]).bfloat16()
    out, _, st = target.backend.forward(q, k, v, rec, causal=True, softmax_scale=128**-0.5)
    rout, _, _ = target.reference(st, rec, causal=True, softmax_scale=128**-0.5, d=128)
    for b in range(2):
        assert rel_l2(out[b], rout[b]) <= 5e-3


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4qk_fp8pv"])
def test_per_head_scales_matter(recipe):
    check_per_head_scales_matter(recipe)


def test_api_end_to_end_and_fidelity():
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 8, 2, 1024, 1024, 128, seed=5, device="cuda"))
    out = fa.attention(q, k, v, recipe="fp8", causal=True, layout="bhsd", backend="triton")
    out.float().square().sum().backward()
    ref, _ = naive_attention(*(t.detach().double() for t in (q, k, v)), causal=True, softmax_scale=128**-0.5)
    assert cosine(out, ref) >= 0.99
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_unsupported_raises():
    q, k, v = make_qkv(1, 2, 2, 64, 64, 96, device="cuda")
    with pytest.raises(
        fa.UnsupportedError, match="triton backend runs head dims 64, 128, not 96; use backend=.reference."
    ):
        fa.attention(q, k, v, recipe="fp8", backend="triton", layout="bhsd")
    q, k, v = make_qkv(1, 2, 2, 64, 64, 128, device="cuda")
    with pytest.raises(RuntimeError, match="forward-only"):
        fa.attention(q.requires_grad_(), k, v, recipe="nvfp4qk_mxfp4pv_fast", backend="triton", layout="bhsd")
    with pytest.raises(fa.UnsupportedError, match="CUDA"):
        fa.attention(q.cpu(), k.cpu(), v.cpu(), recipe="fp8", backend="triton", layout="bhsd")


@pytest.mark.parametrize("recipe", ["nvfp4qk_mxfp4pv_fast", "nvfp4qk_mxfp4pv_accurate"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape", [(2, 8, 2, 300, 300, 64), (2, 8, 2, 300, 333, 128), (1, 32, 8, 4096, 4096, 128)]
)
def test_direct_p_forward_matches_reference(recipe, causal, shape):
    """Direct-P codes do not depend on the tiling (integer anchor), so kernel and reference differ
    by FP32 accumulation order and by exp2/ceil rounding at E2M1 code boundaries on the exact lanes."""
    rec = fa.get_recipe(recipe)
    b, hq, hkv, sq, sk, d = shape
    q, k, v = make_qkv(b, hq, hkv, sq, sk, d, seed=7, device="cuda")
    fa.backends.check_supported("triton", rec, q)
    with torch.no_grad():
        out, lse, st = BE.forward(q, k, v, rec, causal=causal, softmax_scale=d**-0.5)
    rout, rlse, _ = reference_forward_quantized(
        st.q, st.k, st.v, rec, causal=causal, softmax_scale=d**-0.5, block_n=triton_backend.default_block_n(d)
    )
    assert rel_l2(out, rout) <= 5e-3, rel_l2(out, rout)
    fin = torch.isfinite(rlse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - rlse[fin]).abs().max() <= 1e-3
