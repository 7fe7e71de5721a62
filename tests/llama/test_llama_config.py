"""Config validation, presets and the parameter count (8B checked on the meta device)."""

from __future__ import annotations

import pytest
import torch

from llama import (
    AttentionConfig,
    ParallelConfig,
    ProjectionConfig,
    build_gpt_model,
    parameter_count,
    preset,
    transformer_config,
)
from llama.config import PRESETS

LLAMA31_8B_PARAMS = 8_030_261_248


def _numel(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_8b_preset_shapes_and_formula():
    cfg = preset("llama3_1_8b")
    assert (
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.ffn_hidden_size,
        cfg.vocab_size,
    ) == (32, 4096, 32, 8, 128, 14336, 128256)
    assert (cfg.norm_eps, cfg.rope_theta, cfg.rope_scaling, cfg.rope_scaling_factor) == (
        1e-5,
        500000.0,
        True,
        8.0,
    )
    assert (cfg.rope_low_freq_factor, cfg.rope_high_freq_factor, cfg.rope_original_max_position) == (
        1.0,
        4.0,
        8192,
    )
    assert parameter_count(cfg) == LLAMA31_8B_PARAMS


def test_8b_megatron_model_has_exact_parameter_count(mcore):
    # The real megatron-core construction, without allocating 8B parameters.
    with torch.device("meta"):
        model = build_gpt_model(
            preset("llama3_1_8b"), use_cpu_initialization=True, perform_initialization=False
        )
    assert _numel(model) == LLAMA31_8B_PARAMS
    assert not model.share_embeddings_and_output_weights
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert not any("bias" in name for name, _ in model.named_parameters())


@pytest.mark.parametrize("overrides", [{}, {"num_kv_heads": 1}, {"num_kv_heads": 4, "head_dim": 32}])
def test_formula_matches_built_model(mcore, overrides):
    cfg = preset("tiny", **overrides)
    assert _numel(build_gpt_model(cfg)) == parameter_count(cfg)


def test_presets_build_configs():
    for name in PRESETS:
        assert preset(name).vocab_size > 0
    assert 100e6 < parameter_count(preset("small")) < 150e6
    assert parameter_count(preset("tiny")) < 5e6


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: preset("nope"), "unknown model preset"),
        (lambda: preset("tiny", num_kv_heads=3), "multiple of num_kv_heads"),
        (lambda: preset("tiny", head_dim=40), "multiple of 16"),
        (lambda: preset("tiny", rope_high_freq_factor=2.0), "hard-codes"),
        (lambda: preset("tiny", params_dtype="fp16"), "bf16 or fp32"),
        (lambda: AttentionConfig(recipe="fp4"), "known|choose one of"),
        (lambda: ProjectionConfig(precision="int8"), "bf16, te_fp8 or torchao_fp8"),
        (
            lambda: ProjectionConfig(precision="te_fp8", fp8_scaling="delayed", fp8_bf16_first_layers=1),
            "delayed FP8 scaling does not support BF16 first/last",
        ),
        (
            lambda: preset(
                "tiny",
                projection=ProjectionConfig(
                    precision="te_fp8", fp8_bf16_first_layers=2, fp8_bf16_last_layers=1
                ),
            ),
            "lower fp8_bf16",
        ),
        (
            lambda: transformer_config(preset("tiny"), parallel=ParallelConfig(context=2)),
            "context parallelism",
        ),
        (lambda: ParallelConfig(sequence_parallel=True), "parallel.tensor > 1"),
    ],
)
def test_validation_says_how_to_fix(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_builder_checks_parallel_state(mcore):
    with pytest.raises(ValueError, match=r"initialized with \(1, 1, 1\)"):
        build_gpt_model(preset("tiny"), parallel=ParallelConfig(tensor=2))


def test_transformer_config_mapping(mcore):
    import torch.nn.functional as F

    tc = transformer_config(preset("llama3_1_8b"))
    assert (
        tc.num_layers,
        tc.hidden_size,
        tc.num_attention_heads,
        tc.num_query_groups,
        tc.kv_channels,
        tc.ffn_hidden_size,
    ) == (32, 4096, 32, 8, 128, 14336)
    assert tc.normalization == "RMSNorm" and tc.layernorm_epsilon == 1e-5
    assert tc.gated_linear_unit and tc.activation_func is F.silu
    assert not tc.add_bias_linear and not tc.add_qkv_bias
    assert tc.init_method_std == 0.02 and tc.bf16 and tc.params_dtype == torch.bfloat16
    assert tc.hidden_dropout == 0.0 and tc.attention_dropout == 0.0 and tc.fp8 is None
