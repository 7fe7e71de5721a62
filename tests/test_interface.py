"""Public API: layouts, module, registries, saved state, and clear errors (contract §4 case 12)."""

import pytest
import torch

import fp4_attention as fa
from fp4_attention.backends import UnsupportedError

from .conftest import cosine, make_qkv


def test_layouts_agree():
    q, k, v = make_qkv(2, 4, 2, 40, 56, 64, seed=1)
    base = fa.attention(q, k, v, recipe="fp8", causal=True, layout="bhsd")
    bshd = fa.attention(*(t.transpose(1, 2) for t in (q, k, v)), recipe="fp8", causal=True, layout="bshd")
    sbhd = fa.attention(*(t.permute(2, 0, 1, 3) for t in (q, k, v)), recipe="fp8", causal=True, layout="sbhd")
    assert torch.equal(bshd.transpose(1, 2), base)
    assert torch.equal(sbhd.permute(1, 2, 0, 3), base)


def test_module_matches_function_and_trains():
    q, k, v = make_qkv(1, 4, 1, 32, 32, 64, seed=2)
    layer = fa.FP4Attention("nvfp4qk_fp8pv", causal=True, layout="bhsd")
    assert "nvfp4qk_fp8pv" in repr(layer)
    qr = q.clone().requires_grad_()
    out = layer(qr, k, v)
    assert torch.equal(out, fa.attention(q, k, v, recipe="nvfp4qk_fp8pv", causal=True, layout="bhsd"))
    out.float().sum().backward()
    assert qr.grad is not None and qr.grad.dtype == torch.bfloat16


def test_default_softmax_scale_and_lse():
    q, k, v = make_qkv(1, 2, 2, 16, 16, 128, seed=3)
    a, lse = fa.attention(q, k, v, layout="bhsd", return_lse=True)
    b = fa.attention(q, k, v, layout="bhsd", softmax_scale=128**-0.5)
    assert torch.equal(a, b) and lse.shape == (1, 2, 16) and lse.dtype == torch.float32


def test_registries():
    assert set(fa.RECIPES) == {
        "bf16",
        "fp8",
        "nvfp4qk_fp8pv",
        "nvfp4qk_mxfp4pv_fast",
        "nvfp4qk_mxfp4pv_accurate",
    }
    assert fa.TRAINING_RECIPES == ("bf16", "fp8", "nvfp4qk_fp8pv")
    assert "reference" in fa.available_backends()
    with pytest.raises(ValueError, match="known recipes: bf16"):
        fa.get_recipe("fp4")
    with pytest.raises(ValueError, match="known: .*reference"):
        fa.get_backend("cuda_magic")
    with pytest.raises(ValueError, match="already registered"):
        fa.register_backend(fa.get_backend("reference"))


@pytest.mark.parametrize("recipe, saved_bf16", [("bf16", 4), ("fp8", 1), ("nvfp4qk_fp8pv", 1)])
def test_forward_saves_quantized_state(recipe, saved_bf16):
    """Training recipes save payloads + scales (+ the output and LSE), not BF16 Q/K/V."""
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 4, 2, 64, 64, 64, seed=4))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fa.attention(q, k, v, recipe=recipe, causal=True, layout="bhsd")
    bf16 = [t for t in saved if t.dtype == torch.bfloat16]
    assert len(bf16) == saved_bf16  # bf16: q, k, v, out; the FP8 recipes: out only
    if recipe == "nvfp4qk_fp8pv":
        assert sum(t.dtype == torch.uint8 for t in saved) == 4  # Q/K payloads and E4M3 block scales


def test_forward_only_recipe_refuses_gradients():
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 32, 32, 64))
    with pytest.raises(RuntimeError, match="forward-only.*no_grad"):
        fa.attention(q, k, v, recipe="nvfp4qk_mxfp4pv_fast")
    with torch.no_grad():
        assert fa.attention(q, k, v, recipe="nvfp4qk_mxfp4pv_fast").shape == q.shape


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda q, k, v: (q.float(), k, v), TypeError, "must be torch.bfloat16"),
        (lambda q, k, v: (q[0], k, v), ValueError, "must be 4-D"),
        (lambda q, k, v: (q, k, v[:, :5]), ValueError, "same shape"),
        (lambda q, k, v: (q[..., :32], k, v), ValueError, "head dim mismatch"),
        (lambda q, k, v: (q[:, :, :3], k, v), ValueError, "multiple of the key/value heads"),
        (lambda q, k, v: (q[:1], k, v), ValueError, "batch mismatch"),
        (lambda q, k, v: (q[:, :0], k, v), ValueError, "empty sequence"),
        (
            lambda q, k, v: (q[..., :24], k[..., :24], v[..., :24]),
            UnsupportedError,
            "runs head dims multiples of 16 up to 256, not 24",
        ),
        (lambda q, k, v: (q, k, "v"), TypeError, "v must be a torch.Tensor"),
        (lambda q, k, v: (q, k[:, :, :0], v[:, :, :0]), ValueError, "k and v have no heads"),
    ],
)
def test_bad_inputs_raise_clear_errors(mutate, exc, match):
    q, k, v = make_qkv(2, 4, 2, 16, 16, 64)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # bshd
    with pytest.raises(exc, match=match):
        fa.attention(*mutate(q, k, v), recipe="fp8")


def test_bad_options_raise():
    q, k, v = make_qkv(1, 2, 2, 16, 16, 64)
    with pytest.raises(ValueError, match="layout must be one of"):
        fa.attention(q, k, v, layout="hsbd")
    with pytest.raises(ValueError, match="softmax_scale"):
        fa.attention(q, k, v, softmax_scale=-1.0)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['foo'\] for backend 'reference'"):
        fa.FP4Attention("fp8", foo=3)
    for bad in (0, 64.0, "64", True):
        with pytest.raises(ValueError, match="block_n must be a positive int"):
            fa.attention(q, k, v, layout="bhsd", block_n=bad)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['blockn'\].*block_n"):
        fa.attention(q, k, v, layout="bhsd", blockn=64)


@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_the_output_is_contiguous_in_the_callers_layout(layout):
    """As the GPU backends allocate it; the reference's permuted view (found in review, 2026-12-06)
    failed FlashAttention's ``out.view(B, S, -1)``."""
    q, k, v = make_qkv(2, 4, 2, 16, 16, 64)
    perm = {"bshd": (0, 2, 1, 3), "sbhd": (2, 0, 1, 3)}[layout]
    out = fa.attention(*(t.permute(*perm).contiguous() for t in (q, k, v)), layout=layout)
    assert out.is_contiguous() and out.shape == q.permute(*perm).shape
    out.view(out.shape[0], out.shape[1], -1)


def _float64_attention(q, k, v, causal):
    """O and the natural-log LSE in float64 from [B, H, S, D] tensors (GQA: K/V repeated)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -torch.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def lse_loss_cosines(backend: str, recipe: str, device: str, shape, *, out_in_loss: bool, weighted=True):
    """Cosines against float64 autograd of the gradients of a loss on the LSE of causal attention
    (``sum(w * lse)``, N(0, 1) weights ``w``, or ``sum(lse)`` if not ``weighted``), plus
    ``0.05 sum(O^2)`` if ``out_in_loss``: ``[dQ, dK, dV]``, or ``[dQ, dK]`` with only the LSE in the
    loss (the output's gradient None), where dV must be exactly 0 (asserted)."""
    q, k, v = make_qkv(*shape, seed=7)
    w = (
        torch.randn(q.shape[:3], generator=torch.Generator().manual_seed(8))
        if weighted
        else torch.ones(q.shape[:3])
    )
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    o64, lse64 = _float64_attention(*exact, causal=True)
    ((o64**2).sum() * 0.05 * out_in_loss + (lse64 * w.double()).sum()).backward()
    ins = [t.to(device, copy=True).requires_grad_() for t in (q, k, v)]
    o, lse = fa.attention(*ins, recipe=recipe, causal=True, layout="bhsd", backend=backend, return_lse=True)
    ((lse * w.to(device)).sum() + ((o.float() ** 2).sum() * 0.05 if out_in_loss else 0.0)).backward()
    if not out_in_loss:  # P-weighted sums of K (dQ) and Q (dK), no dV
        assert torch.count_nonzero(ins[2].grad) == 0
        ins, exact = ins[:2], exact[:2]
    return [cosine(g.grad, e.grad) for g, e in zip(ins, exact, strict=True)]


@pytest.mark.parametrize("recipe, at_least", [("bf16", 0.99999), ("fp8", 0.998), ("nvfp4qk_fp8pv", 0.985)])
def test_the_lse_has_a_gradient(recipe, at_least):
    """Found in review (2026-12-06): the LSE was marked non-differentiable, so a loss on it (merging
    partial attentions by their LSE, a z-loss) got gradients without its term and no word. Against
    float64 autograd of a loss on O and the LSE, and on the LSE alone (the output's gradient None)."""
    shape = (1, 4, 2, 48, 48, 32)
    cosines = lse_loss_cosines("reference", recipe, "cpu", shape, out_in_loss=True)
    assert min(cosines) >= at_least, (recipe, cosines)
    dq_cosine = lse_loss_cosines("reference", recipe, "cpu", shape, out_in_loss=False, weighted=False)[0]
    assert dq_cosine >= at_least, (recipe, dq_cosine)


def check_lse_merge(backend: str, recipe: str, device: str, shape=(1, 4, 2, 48, 64, 32)):
    """Attention over two halves of the keys, merged by their LSEs (``lse = logaddexp(lse1, lse2)``,
    ``o = sum o_i exp(lse_i - lse)``: how context-parallel and split-KV attention combine partial
    results), trained through: the gradients against float64 autograd of the whole attention are
    within 1e-3 of cosine of the same backend's whole attention (non-causal). Without the LSE's
    gradient the merge's dQ/dK drop to ~0.985 even in bf16."""
    q, k, v = make_qkv(*shape, seed=3)
    w = torch.randn(q.shape, generator=torch.Generator().manual_seed(4))
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    (_float64_attention(*exact, causal=False)[0] * w.double()).sum().backward()
    opts = dict(recipe=recipe, layout="bhsd", backend=backend)

    def leaves():
        return [t.to(device, copy=True).requires_grad_() for t in (q, k, v)]

    merged, half = leaves(), k.shape[2] // 2
    parts = [
        fa.attention(merged[0], *(t[:, :, keys].contiguous() for t in merged[1:]), return_lse=True, **opts)
        for keys in (slice(0, half), slice(half, None))
    ]
    lse = torch.logaddexp(parts[0][1], parts[1][1])
    out = sum(o.float() * torch.exp(part_lse - lse).unsqueeze(-1) for o, part_lse in parts)
    (out * w.to(device)).sum().backward()
    whole = leaves()
    (fa.attention(*whole, **opts).float() * w.to(device)).sum().backward()
    for name, m, a, e in zip("qkv", merged, whole, exact):
        c_merged, c_whole = cosine(m.grad, e.grad), cosine(a.grad, e.grad)
        assert c_merged >= c_whole - 1e-3, (backend, recipe, name, c_merged, c_whole)
    return [cosine(m.grad, e.grad) for m, e in zip(merged, exact)]


@pytest.mark.parametrize("recipe", ["bf16", "fp8", "nvfp4qk_fp8pv"])
def test_attention_merged_by_lse_trains_like_the_whole(recipe):
    cosines = check_lse_merge("reference", recipe, "cpu")
    if recipe == "bf16":
        assert min(cosines) >= 0.9999, cosines


def test_a_backend_without_the_lse_gradient_refuses_it():
    from fp4_attention import backends
    from fp4_attention.backends import BackendSpec

    from .conftest import ReferenceBacked

    fa.register_backend(
        ReferenceBacked(
            BackendSpec(name="no_lse_test", impl="unused:Unused", recipes=("fp8",), devices=("cpu",))
        )
    )
    try:
        q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 16, 16, 64))
        out, lse = fa.attention(q, k, v, recipe="fp8", backend="no_lse_test", layout="bhsd", return_lse=True)
        with pytest.raises(NotImplementedError) as err:
            (out.float().sum() + lse.sum()).backward(retain_graph=True)
        assert str(err.value) == (
            "the LSE returned by attention(..., return_lse=True) is in the loss, and backend 'no_lse_test' "
            "has no gradient for it (backends with one: cute, reference, triton); use one of those, or "
            "lse.detach() where its gradient is not wanted"
        )
        (out.float().sum() + lse.detach().sum()).backward()  # the output alone: as before
        assert q.grad is not None
    finally:
        backends._SPECS.pop("no_lse_test")
        backends._INSTANCES.pop("no_lse_test")
