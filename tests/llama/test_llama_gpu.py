"""The tiny Llama on a CUDA GPU with the Triton attention backend (run on the H200: pytest -m gpu).

Skips cleanly without CUDA, and with the reason when ``fp4_attention.backends.triton.backend`` cannot be
imported. Tolerance vs the reference backend on the same GPU, same weights: logits rel-L2 <= 1e-2
(the backends share quantized operands and differ by FP32 accumulation order and the few E4M3 P
roundings it flips, ~1e-3 per attention layer; see tests/backends/test_triton_backend.py).
"""

from __future__ import annotations

import pytest
import torch

import fp4_attention as fa
from llama import AttentionConfig, build_gpt_model, preset

from .conftest import tokens

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def triton_backend():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    try:
        import fp4_attention.backends.triton.backend  # noqa: F401  (registers "triton")
    except Exception as exc:  # noqa: BLE001  (ImportError, or a GPU/toolchain the module refuses)
        pytest.skip(f"fp4_attention.backends.triton.backend is not importable: {type(exc).__name__}: {exc}")
    return "triton"


def rel_l2(x, ref):
    x, ref = x.detach().double(), ref.detach().double()
    return float((x - ref).norm() / ref.norm())


@pytest.mark.parametrize("recipe", fa.TRAINING_RECIPES)
def test_tiny_model_trains_on_gpu_with_triton(mcore, triton_backend, recipe):
    torch.manual_seed(0)
    cfg = preset("tiny", attention=AttentionConfig(recipe=recipe, backend=triton_backend))
    model = build_gpt_model(cfg)
    assert next(model.parameters()).is_cuda
    ids, pos, labels = tokens(2, 256, cfg.vocab_size)
    loss = model(input_ids=ids, position_ids=pos, attention_mask=None, labels=labels)
    assert torch.isfinite(loss).all()
    loss.float().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name

    reference = build_gpt_model(cfg.replace(attention=AttentionConfig(recipe=recipe, backend="reference")))
    reference.load_state_dict(model.state_dict(), strict=True)
    with torch.no_grad():
        a = model(input_ids=ids, position_ids=pos, attention_mask=None)
        b = reference(input_ids=ids, position_ids=pos, attention_mask=None)
    assert rel_l2(a, b) <= 1e-2, rel_l2(a, b)


def test_small_preset_forward_backward_on_gpu(mcore, triton_backend):
    cfg = preset("small", attention=AttentionConfig(recipe="nvfp4qk_fp8pv", backend=triton_backend))
    model = build_gpt_model(cfg)
    ids, pos, labels = tokens(2, 1024, cfg.vocab_size)
    loss = model(input_ids=ids, position_ids=pos, attention_mask=None, labels=labels).float().mean()
    loss.backward()
    assert torch.isfinite(loss)
