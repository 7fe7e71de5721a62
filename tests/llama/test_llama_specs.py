"""Layer specs: our core attention in the slot; TE where importable; precision errors."""

from __future__ import annotations

import pytest

from fp4_attention.megatron import FP4CoreAttention
from llama import AttentionConfig, ProjectionConfig, build_gpt_model, layer_spec, preset
from llama.builder import fp8_settings
from llama.specs import have_transformer_engine, uses_transformer_engine

HAVE_TE = have_transformer_engine()
needs_te = pytest.mark.skipif(
    not HAVE_TE, reason="transformer_engine is not importable (install the 'te' extra)"
)
needs_no_te = pytest.mark.skipif(HAVE_TE, reason="checks the error raised when transformer_engine is missing")


def _slot(spec):
    return spec.submodules.self_attention.submodules.core_attention


def test_local_spec_carries_our_attention_and_settings():
    cfg = preset(
        "tiny", transformer_impl="local", attention=AttentionConfig(recipe="fp8", backend="reference")
    )
    slot = _slot(layer_spec(cfg))
    assert slot.module is FP4CoreAttention
    assert slot.params == {"attention": AttentionConfig(recipe="fp8", backend="reference")}
    assert not uses_transformer_engine(cfg)


def test_spec_is_a_copy():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    layer_spec(preset("tiny", transformer_impl="local"))
    fresh = get_gpt_layer_local_spec(normalization="RMSNorm")
    assert FP4CoreAttention not in (_slot(fresh), getattr(_slot(fresh), "module", None))


def test_torchao_fp8_is_rejected_with_the_reason():
    with pytest.raises(ValueError, match="not nn.Linear"):
        layer_spec(preset("tiny", projection=ProjectionConfig(precision="torchao_fp8")))


@needs_no_te
def test_te_precision_without_te_names_the_extra():
    with pytest.raises(ValueError, match=r"install the 'te' extra"):
        layer_spec(preset("tiny", projection=ProjectionConfig(precision="te_fp8")))
    with pytest.raises(ValueError, match=r"install the 'te' extra"):
        layer_spec(preset("tiny", transformer_impl="transformer_engine"))


def test_fp8_settings_mapping():
    assert fp8_settings(preset("tiny")) == {}
    current = preset(
        "tiny",
        projection=ProjectionConfig(
            precision="te_fp8",
            fp8_format="hybrid",
            fp8_scaling="current",
            fp8_bf16_first_layers=1,
            fp8_bf16_last_layers=1,
        ),
    )
    assert fp8_settings(current) == {
        "fp8": "hybrid",
        "fp8_recipe": "tensorwise",
        "disable_parameter_transpose_cache": False,
        "first_last_layers_bf16": True,
        "num_layers_at_start_in_bf16": 1,
        "num_layers_at_end_in_bf16": 1,
    }
    delayed = preset(
        "tiny",
        projection=ProjectionConfig(
            precision="te_fp8", fp8_format="e4m3", fp8_scaling="delayed", fp8_weight_cache=False
        ),
    )
    assert fp8_settings(delayed) == {
        "fp8": "e4m3",
        "fp8_recipe": "delayed",
        "disable_parameter_transpose_cache": True,
        "fp8_amax_history_len": 1024,
        "fp8_amax_compute_algo": "max",
    }


@needs_te
def test_te_spec_carries_our_attention(mcore):
    from megatron.core.extensions.transformer_engine import (
        TELayerNormColumnParallelLinear,
        TERowParallelLinear,
    )

    cfg = preset("tiny")
    spec = layer_spec(cfg)
    assert _slot(spec).module is FP4CoreAttention
    attn = spec.submodules.self_attention.submodules
    assert attn.linear_qkv is TELayerNormColumnParallelLinear and attn.linear_proj is TERowParallelLinear


@needs_te
@pytest.mark.gpu
@pytest.mark.parametrize("scaling", ["current", "delayed"])
def test_te_fp8_model_builds_and_trains(mcore, scaling):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("TE FP8 needs a CUDA GPU")
    bf16_layers = 1 if scaling == "current" else 0
    cfg = preset(
        "tiny",
        projection=ProjectionConfig(
            precision="te_fp8",
            fp8_scaling=scaling,
            fp8_bf16_first_layers=bf16_layers,
            fp8_bf16_last_layers=bf16_layers,
        ),
    )
    model = build_gpt_model(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 64), device="cuda")
    pos = torch.arange(64, device="cuda")[None].expand(2, 64)
    loss = model(input_ids=ids, position_ids=pos, attention_mask=None, labels=ids)
    loss.float().mean().backward()
    assert torch.isfinite(loss).all()
