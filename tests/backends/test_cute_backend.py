"""``cute`` backend (CuTe DSL fp8 forward and backward, nvfp4qk_fp8pv forward, sm_90) and ``fa4``
backend vs the torch reference.

The same assertions as test_triton_backend.py (its ``compare``), with the reference run at the
CuTe kernel's KV tile (``block_n = tile_n``) and in its tile order (last to first,
``reverse_tiles``), since FP8 P is rounded against the running max of its tile. Gradients come from
the CuTe backward on the CuTe forward's state and output, against the reference backward on the same
state (``compare``).
"""

import pytest
import torch

import fp4_attention as fa
from fp4_attention.numerics.exact import naive_attention

from ..conftest import cosine, make_qkv, rel_l2

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

from fp4_attention.backends.cute import backend as cute_backend  # noqa: E402
from fp4_attention.backends.pv_layout import permute_v_for_pv  # noqa: E402
from fp4_attention.backends.triton.quant_v import quantize_fp8_v_transposed  # noqa: E402
from fp4_attention.numerics.quant import quantize_fp8_key_groups  # noqa: E402
from fp4_attention.numerics.recipes import with_k_scale_keys  # noqa: E402

from . import test_triton_backend as tt  # noqa: E402

RECIPES = ["fp8", "nvfp4qk_fp8pv"]
# the two defaults (cute_backend.default_tiles: D128, and D64), each causal or not; the other supported
# tiles run the forward tests of test_other_tiles_match_reference
TILES = [cute_backend.DEFAULT_TILES, cute_backend.D128_TILES]


class _TiledCute(cute_backend.CuteBackend):
    """The cute backend at fixed tiles (the ``tiles`` option of every forward and backward call)."""

    def __init__(self, tiles):
        super().__init__()
        self.tiles = tiles

    def forward(self, q, k, v, recipe, *, causal, softmax_scale, tiles=None):
        return super().forward(q, k, v, recipe, causal=causal, softmax_scale=softmax_scale, tiles=self.tiles)


def _target(tiles, backend=None) -> tt.Target:
    """The cute backend at ``tiles`` (or ``backend``, one at those tiles) against the reference at
    the kernel's KV tile, visited like the kernel (FA4's producer order) last to first; the saved V
    is put back in key order (``triton_state``) for it. Nothing of the Triton backend is patched:
    the backward (the CuTe kernel) runs at its own tiles."""
    return tt.Target(
        backend or _TiledCute(tiles),
        lambda d: tiles[1],
        reverse_tiles=True,
        reference_v=lambda st: tt._untransposed_v(cute_backend.triton_state(st)),
    )


@pytest.fixture(params=TILES, ids=lambda t: "t{}x{}s{}".format(*t))
def cute(request) -> tt.Target:
    """Every kernel test at both default tiles (``_target``), causal or not."""
    return _target(request.param)


@pytest.mark.parametrize(
    "tiles", [t for t in cute_backend.SUPPORTED_TILES if t not in TILES], ids=lambda t: "t{}x{}s{}".format(*t)
)
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_other_tiles_match_reference(tiles, recipe, causal, d):
    """The forward at every other supported tile: GQA 4, lengths that are not multiples of the KV
    tile, and more queries than keys (the backward does not depend on the forward's tiles)."""
    tn = tiles[1]
    for b, hq, hkv, sq, sk in (
        (2, 8, 2, 300, 300),
        (1, 4, 1, 2 * tn + 1, 3 * tn - 1),
        (1, 4, 1, 2 * tn, tn + 7),
    ):
        tt.compare(recipe, b, hq, hkv, sq, sk, d, causal, grads=False, target=_target(tiles))


K64 = with_k_scale_keys("fp8", 64)  # the recipe option: K scales per 64 keys (the kernel's k_group=64)


@pytest.mark.parametrize(
    "tiles", [(128, 128, 2), (128, 192, 2), (128, 64, 2)], ids=lambda t: "t{}x{}s{}".format(*t)
)
@pytest.mark.parametrize("causal", [False, True])
def test_k_scale_keys_matches_reference(tiles, causal):
    """``fp8`` with ``k_scale_keys=64`` through the backend (the Triton group quantizer, the forward's
    ``k_group=64``: one K scale per 64 keys folded into the row factor per group) against the
    reference on the same quantized inputs, with the tests' fp8 tolerances: GQA, lengths that are not
    multiples of 64 or of the tile, more queries than keys (rows without keys), and the training
    shape. The gradients come from the CuTe backward on this state (it reads the group scale repeated
    per key as per-token scales)."""
    for b, hq, hkv, sq, sk in (
        (2, 8, 2, 300, 300),
        (1, 4, 1, 200, 130),
        (1, 4, 1, 257, 1000),
        (1, 32, 8, 4096, 4096),
    ):
        tt.compare(K64, b, hq, hkv, sq, sk, 128, causal, target=_target(tiles))


def test_k_scale_keys_state_and_tiles():
    """The saved K has one scale per 64 keys (the bytes of ``numerics.quant``'s definition), and KV
    tiles that are not a multiple of 64 keys are refused with the tiles that work."""
    q, k, v = make_qkv(1, 4, 1, 200, 200, 128, device="cuda")
    _, _, st = cute_backend.CuteBackend().forward(q, k, v, K64, causal=True, softmax_scale=128**-0.5)
    want = quantize_fp8_key_groups(k, 64)
    assert torch.equal(st.k.scale, want.scale) and torch.equal(
        st.k.data.view(torch.uint8), want.data.view(torch.uint8)
    )
    with pytest.raises(ValueError, match=r"k_group must be 0 or 64.*use k_group=0, or one of the tiles"):
        _TiledCute((128, 96, 2)).forward(q, k, v, K64, causal=True, softmax_scale=128**-0.5)


def _fa4_postprocess(ops, state, softmax_scale):
    """flash-attn-4's postprocess kernel (one launch per tensor) on the CuTe backward's accumulators:
    the conversion ``backend.postprocess_gradients`` ran until ``triton.bwd_post`` replaced it (9f1ad40,
    results/session_2026-12-05b_h200), kept here as the oracle of its bytes."""
    import cutlass
    from flash_attn.cute.interface import _bwd_postprocess_convert

    from fp4_attention.backends.layouts import empty_in_layout_of

    tile_m, tile_n = cute_backend.BWD_TILES
    b, hq, sq, d = state.out.shape
    hkv, sk = ops["v8"].shape[1:3]
    post = dict(arch=90, dtype=cutlass.BFloat16, hdim=d, num_threads=256, swap_ab=False, fake_mode=False)
    dq = empty_in_layout_of(state.out, (b, hq, sq, d))
    _bwd_postprocess_convert(
        ops["dq_accum"],
        dq.permute(0, 2, 1, 3),
        softmax_scale,
        None,
        None,
        block_size=tile_m,
        atom_layout=1,
        **post,
    )
    if ops["dk"].dim() == 4:  # no GQA: the kernel wrote BF16 dK/dV
        return dq, ops["dk"], ops["dv"]
    dk, dv = (empty_in_layout_of(state.out, (b, hkv, sk, d)) for _ in range(2))
    for acc, t in ((ops["dk"], dk), (ops["dv"], dv)):
        _bwd_postprocess_convert(
            acc, t.permute(0, 2, 1, 3), 1.0, None, None, block_size=tile_n, atom_layout=2, **post
        )
    return dq, dk, dv


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 6])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_triton_postprocess_equals_fa4(recipe, d, group, layout):
    """``postprocess_gradients`` (``triton.bwd_post``, one launch) writes the bytes of FA4's
    postprocess (three launches for GQA), bit for bit: on the accumulators of one real backward
    (lengths off the 64-query and 128-key blocks, causal) and on random FP32 accumulators whose
    padding rows hold values that must not reach the gradients; gradients in the caller's layout."""
    rec, sm = fa.get_recipe(recipe), d**-0.5
    be = cute_backend.CuteBackend()
    for b, sq, sk in ((2, 300, 300), (1, 257, 130), (1, 64, 4096)):
        hkv = 2
        q, k, v = make_qkv(b, hkv * group, hkv, sq, sk, d, device="cuda")
        if layout == "bshd":  # [B, H, S, D] views of bshd memory, as the interface hands them over
            q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        out, lse, st = be.forward(q, k, v, rec, causal=True, softmax_scale=sm)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).bfloat16().cuda()
        ops = cute_backend.backward_operands(st, dout, sm)
        args = cute_backend._bwd_args(ops)
        qk_bf16 = rec.qk == "nvfp4"
        fn = cute_backend._compiled_bwd(d, group, True, qk_bf16, args, sm)
        fn(*[t.view(torch.uint8) if t.element_size() == 1 else t for t in args], sm)
        for fill in ("kernel", "random"):
            if fill == "random":  # every accumulator value, padding rows included
                n = ops["acc"].numel() - 2 * b * hkv * group  # not the dO amax words after them
                ops["acc"][:n] = torch.randn(n, device="cuda") * 100.0
            fa4 = _fa4_postprocess(ops, st, sm)
            ours = cute_backend.postprocess_gradients(ops, st, sm)
            for name, a, o in zip("qkv", fa4, ours):
                assert o.stride() == a.stride(), (name, fill)
                same = torch.equal(a.view(torch.int16), o.view(torch.int16))
                assert same, (name, fill, (a.float() - o.float()).abs().max().item())


@pytest.mark.parametrize("sk", [16, 100, 4096])
def test_v_quantizer_perm16_layout(sk):
    v = torch.randn(2, 3, sk, 128, device="cuda").bfloat16()
    plain = quantize_fp8_v_transposed(v)
    perm = quantize_fp8_v_transposed(v, perm16=True)
    assert torch.equal(perm.data.view(torch.uint8), permute_v_for_pv(plain.data).view(torch.uint8))
    assert torch.equal(perm.scale, plain.scale)
    assert torch.equal(
        cute_backend.unpermute_v(perm, sk).data.view(torch.uint8), plain.data.view(torch.uint8)
    )


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 6])
def test_matches_reference_shapes(recipe, causal, d, group, cute):
    tt.compare(recipe, 2, 2 * group, 2, 300, 300, d, causal, target=cute)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 4])
def test_lse_gradient_matches_reference(recipe, causal, group, cute):
    """The LSE's gradient (``D - dlse`` before the kernel reads D) against the reference on the same
    state, with a ragged tile and rows without keys (Sq > Sk, causal)."""
    tt.compare(recipe, 2, 2 * group, 2, 300, 300, 128, causal, target=cute, dlse=True)
    tt.compare(recipe, 1, 2 * group, 2, 257, 129, 128, causal, target=cute, dlse=True)


@pytest.mark.parametrize("recipe", RECIPES)
def test_lse_gradient_through_the_api(recipe):
    tt.check_lse_gradient_through_the_api("cute", recipe)


@pytest.mark.parametrize("recipe", RECIPES)
def test_attention_merged_by_lse_trains_like_the_whole(recipe):
    from ..test_interface import check_lse_merge

    check_lse_merge("cute", recipe, "cuda", shape=(1, 8, 2, 512, 512, 128))


@pytest.mark.parametrize("recipe", RECIPES)
def test_token_scale_placement(recipe):
    """The backward places the token scales as the recipe defines them: in the BF16 Q/K operands
    with one BF16 dS for ``fp8``, on dS for ``nvfp4qk_fp8pv`` (``tt.check_token_scale_placement``)."""
    tt.check_token_scale_placement(recipe, target=_target(cute_backend.DEFAULT_TILES))


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("n", [127, 128, 129, 255, 256, 257])
def test_tile_boundaries(recipe, n, cute):
    tt.compare(recipe, 1, 4, 1, n, n, 128, True, target=cute)
    tt.compare(recipe, 1, 4, 1, n // 2 + 1, n, 128, True, target=cute)
    tt.compare(recipe, 1, 4, 1, n, n // 2 + 1, 128, True, target=cute)


@pytest.mark.parametrize("recipe", RECIPES)
def test_real_training_shape(recipe, cute):
    tt.compare(recipe, 1, 32, 8, 4096, 4096, 128, True, target=cute)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("scale", [2.0, 3.0])
def test_wide_logits(recipe, scale, cute):
    tt.compare(recipe, 1, 8, 2, 1024, 1024, 128, True, scale=scale, target=cute)


@pytest.mark.parametrize("recipe", RECIPES)
def test_long_kv_no_drift(recipe, cute):
    tt.compare(recipe, 1, 2, 1, 256, 131072, 128, False, grads=False, target=cute)


@pytest.mark.parametrize("recipe", RECIPES)
def test_per_head_scales_matter(recipe, cute):
    tt.check_per_head_scales_matter(recipe, target=cute)


@pytest.mark.parametrize("recipe", RECIPES)
def test_zero_dout_exact_zero(recipe, cute):
    tt.check_zero_dout_exact_zero(recipe, target=cute)


def test_api_end_to_end_and_fidelity():
    q, k, v = make_qkv(2, 8, 2, 1024, 1024, 128, device="cuda")
    out = fa.attention(q, k, v, recipe="fp8", causal=True, layout="bhsd", backend="cute")
    ref, _ = naive_attention(q.double(), k.double(), v.double(), causal=True, softmax_scale=128**-0.5)
    assert cosine(out, ref) >= 0.99  # the Triton test's bound (FP8 Q/K/P/V against float64)


def test_backward_through_the_api_is_the_backends():
    """fa.attention(backend='cute') gradients are the CuTe backward's on the CuTe forward's state:
    equal to calling the backend directly up to the FP32 order of the atomic accumulations (dQ over
    KV blocks, dK/dV over the GQA group)."""
    q, k, v = make_qkv(1, 8, 2, 700, 700, 128, device="cuda")
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).bfloat16().cuda()
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    fa.attention(qg, kg, vg, recipe="fp8", causal=True, layout="bhsd", backend="cute").backward(dout)
    be, rec, sm = cute_backend.CuteBackend(), fa.get_recipe("fp8"), 128**-0.5
    _, _, st = be.forward(q, k, v, rec, causal=True, softmax_scale=sm)
    direct = be.backward(st, dout, rec, causal=True, softmax_scale=sm)
    for g_api, g in zip((qg.grad, kg.grad, vg.grad), direct):
        assert torch.isfinite(g_api).all()
        assert rel_l2(g_api, g) <= 1e-3


@pytest.mark.parametrize("sq, sk", [(300, 200), (400, 200), (600, 200)])
def test_rows_without_keys_first_tile_below_key_zero(sq, sk, cute):
    """Causal Sq > Sk: the first query block's first KV tile is block -1 (400/200) or -3 (600/200),
    whose K-scale loads are the clamped ones below key 0 (the loads issue before the QK product,
    unclamped after the first tile); its rows end with O = 0 and LSE = -inf, as the reference."""
    tt.compare("fp8", 2, 8, 2, sq, sk, 128, True, target=cute)


def test_unsupported_raises():
    q, k, v = make_qkv(1, 4, 1, 128, 128, 128, device="cuda")
    with pytest.raises(fa.UnsupportedError, match="backend='triton'"):
        fa.attention(q, k, v, recipe="nvfp4qk_mxfp4pv_fast", backend="cute", layout="bhsd")
    with pytest.raises(fa.UnsupportedError, match="backend='cute'"):
        fa.attention(q, k, v, recipe="fp8", backend="fa4", layout="bhsd")


@pytest.mark.parametrize("causal", [False, True])
def test_fa4_bf16_matches_exact(causal):
    q, k, v = make_qkv(2, 8, 2, 1024, 1024, 128, device="cuda")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = fa.attention(q, k, v, recipe="bf16", causal=causal, layout="bhsd", backend="fa4")
    dout = torch.randn_like(out)
    out.backward(dout)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = naive_attention(qd, kd, vd, causal=causal, softmax_scale=128**-0.5)
    ref.backward(dout.double())
    assert rel_l2(out, ref) <= 1e-2
    for g, r in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert rel_l2(g, r) <= 2e-2
