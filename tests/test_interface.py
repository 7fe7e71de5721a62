"""Public API: layouts, module, registries, saved state, and clear errors (contract §4 case 12)."""

import pytest
import torch

import fp4_attention as fa
from fp4_attention.backends import UnsupportedError

from .conftest import make_qkv


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
    with pytest.raises(ValueError, match="block_n must be positive"):
        fa.attention(q, k, v, layout="bhsd", block_n=0)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['blockn'\].*block_n"):
        fa.attention(q, k, v, layout="bhsd", blockn=64)
