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
from fp4_attention.numerics.operands import SavedState
from fp4_attention.numerics.reference import reference_backward

from ..conftest import cosine, make_qkv, rel_l2

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

from fp4_attention.backends.cute import backend as cute_backend  # noqa: E402
from fp4_attention.backends.pv_layout import permute_v_for_pv  # noqa: E402
from fp4_attention.backends.triton.quant import quantize_fp8_v_transposed  # noqa: E402
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


class _ExpF16Cute(_TiledCute):
    """The cute backend with the measurement option ``exp_f16`` in its forward, and with
    ``backward=True`` in its backward too."""

    def __init__(self, tiles, backward=False):
        super().__init__(tiles)
        self.exp_f16_backward = backward

    def forward(self, q, k, v, recipe, *, causal, softmax_scale, tiles=None):
        return cute_backend.CuteBackend.forward(
            self, q, k, v, recipe, causal=causal, softmax_scale=softmax_scale, tiles=self.tiles, exp_f16=True
        )

    def backward(self, state, dout, recipe, *, causal, softmax_scale, tiles=None):
        return cute_backend.CuteBackend.backward(
            self,
            state,
            dout,
            recipe,
            causal=causal,
            softmax_scale=softmax_scale,
            exp_f16=self.exp_f16_backward,
        )


@pytest.mark.parametrize("tiles", TILES, ids=lambda t: "t{}x{}s{}".format(*t))
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_exp_f16_matches_its_reference(tiles, recipe, causal, d):
    """The measurement option ``exp_f16`` (P's exponentials and row sum through FP16) against the
    reference's ``p_fp16`` (the same FP16 steps: ``reference._p_fp16``) on the same quantized inputs,
    with the tests' bounds for FP8 QK, for BF16 QK too. The kernel's ``ex2.approx.f16`` is within
    2^-9.9 (PTX's bound, about one FP16 step) of the reference's correctly rounded FP16 power.
    Output 1e-2 (not BF16 QK's 5e-3): a CPU simulation of that bound, one FP16 step either way on
    2/3 of the values, gave 3.7e-3 to 5.5e-3 on these shapes, each step flipping about 1% of P's
    E4M3 codes (a table of the H200's 65,536 FP16 results would make the reference exact). LSE
    3.5e-3 (not 1e-4): where a P differs, each of the row-sum tree's log2(24) FP16 additions above
    it may round the other way (2^-11 each), at most 1e-3 + 2.3e-3 of the row sum (the worst
    case; the simulation stayed below 1.1e-3; the test prints what it sees). Lengths off the tile grid,
    GQA, rows without keys (Sq > Sk causal); for ``fp8`` also ``tt.compare`` (the gradients of the
    CuTe backward on this state).
    Prints how far the option's reference moves from the recipe's (rel-L2 of the output, LSE)."""
    target = tt.Target(
        _ExpF16Cute(tiles),
        lambda d: tiles[1],
        reverse_tiles=True,
        reference_v=lambda st: tt._untransposed_v(cute_backend.triton_state(st)),
        reference_forward_options=(("p_fp16", True),),
    )
    rec, tn, sm = fa.get_recipe(recipe), tiles[1], d**-0.5
    for b, hq, hkv, sq, sk in ((2, 8, 2, 300, 300), (1, 4, 1, 2 * tn + 1, 3 * tn - 1), (1, 4, 1, 600, 200)):
        q, k, v = make_qkv(b, hq, hkv, sq, sk, d, device="cuda")
        out, lse, st = target.backend.forward(q, k, v, rec, causal=causal, softmax_scale=sm)
        rout, rlse, _ = target.reference(st, rec, causal=causal, softmax_scale=sm, d=d)
        dout, dlse = _target(tiles).reference(st, rec, causal=causal, softmax_scale=sm, d=d)[:2]
        fin = torch.isfinite(rlse)
        assert torch.equal(torch.isfinite(lse), fin) and torch.isfinite(out).all()
        d_out, d_lse = rel_l2(out, rout), (lse[fin] - rlse[fin]).abs().max().item()
        moved = rel_l2(rout, dout), (rlse[fin] - dlse[fin]).abs().max().item()
        print(
            f"exp_f16 {recipe} d{d} causal={causal} t{tiles} {sq}x{sk}: kernel-ref out {d_out:.2e} "
            f"lse {d_lse:.2e}; p_fp16 ref - recipe ref out {moved[0]:.2e} lse {moved[1]:.2e}"
        )
        assert d_out <= 1e-2, d_out
        assert d_lse <= 3.5e-3, d_lse
    if rec.qk == "fp8":  # with gradients, all of tt.compare's bounds (BF16 QK: its LSE bound is 1e-4)
        tt.compare(recipe, 2, 8, 2, 300, 300, d, causal, target=target)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 4])
def test_exp_f16_backward_matches_its_reference(recipe, causal, d, group):
    """The backward's ``exp_f16`` (P^T through FP16, ``FP8BackwardSm90(exp_f16=True)``) on the state of
    the forward with ``exp_f16``, against ``reference_backward(p_fp16=True)`` on the kernel's own
    output and LSE: the tests' gradient bounds (``tt.compare``: 2e-2 for FP8 QK, 1e-2 for BF16 QK);
    ``ex2.approx.f16`` is within about one FP16 step of the reference's correctly rounded power, and
    where that moves a P^T E4M3 code, dV moves by one E4M3 step of that P. Lengths off the tiles,
    rows without keys (Sq > Sk causal), GQA. Prints the distances, and how far the option's
    reference gradients are from the recipe's."""
    tiles = cute_backend.default_tiles(d)
    target = tt.Target(
        _ExpF16Cute(tiles, backward=True),
        lambda d: tiles[1],
        reverse_tiles=True,
        reference_v=lambda st: tt._untransposed_v(cute_backend.triton_state(st)),
        reference_forward_options=(("p_fp16", True),),
    )
    rec, sm = fa.get_recipe(recipe), d**-0.5
    bound = 2e-2 if rec.qk == "fp8" else 1e-2
    for b, hq, hkv, sq, sk in ((2, 2 * group, 2, 300, 300), (1, group, 1, 257, 130)):
        q, k, v = make_qkv(b, hq, hkv, sq, sk, d, device="cuda")
        out, lse, st = target.backend.forward(q, k, v, rec, causal=causal, softmax_scale=sm)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).bfloat16().cuda()
        got = target.backend.backward(st, dout, rec, causal=causal, softmax_scale=sm)
        # the reference reads the kernel's own output and LSE, V in its key order (tt.compare's way)
        rst = target.reference(st, rec, causal=causal, softmax_scale=sm, d=d)[2]
        ref_state = SavedState(q=rst.q, k=rst.k, v=rst.v, out=out, lse=lse)
        kw = dict(causal=causal, softmax_scale=sm)
        ref = reference_backward(ref_state, dout, rec, p_fp16=True, **kw)
        plain = reference_backward(ref_state, dout, rec, **kw)
        for name, g, r, p in zip("qkv", got, ref, plain):
            assert torch.isfinite(g).all(), name
            dist, moved = rel_l2(g, r), rel_l2(r, p)
            print(
                f"exp_f16 bwd {recipe} d{d} g{group} causal={causal} {sq}x{sk} d{name}: {dist:.2e} "
                f"(p_fp16 ref - recipe ref {moved:.2e})"
            )
            assert dist <= bound, (name, dist)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 6])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_triton_postprocess_equals_fa4(recipe, d, group, layout):
    """``postprocess="triton"`` (``triton.bwd_post``, one launch) writes the bytes of FA4's
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
            fa4 = cute_backend.postprocess_gradients(ops, st, sm, "fa4")
            ours = cute_backend.postprocess_gradients(ops, st, sm, "triton")
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
