"""Llama-3.1 models on megatron-core with the ``fp4_attention`` core attention.

    from llama import preset, build_gpt_model, AttentionConfig
    cfg = preset("tiny", attention=AttentionConfig(recipe="nvfp4qk_fp8pv"))
    model = build_gpt_model(cfg)            # after initialize_model_parallel(...)

Modules: ``config`` (typed config, presets, parameter count), ``specs`` (layer specs: TE or local
projections around our core attention), ``builder`` (TransformerConfig + GPTModel), ``cpu_compat``
(megatron-core's CUDA assumptions on a machine without a GPU). The core-attention module itself is
``fp4_attention.megatron``; ``AttentionConfig`` is ``fp4_attention``'s, re-exported.
"""

from .builder import build_gpt_model, transformer_config
from .config import (
    PRESETS,
    AttentionConfig,
    LlamaConfig,
    ParallelConfig,
    ProjectionConfig,
    parameter_count,
    preset,
)
from .specs import layer_spec

__all__ = [
    "PRESETS",
    "AttentionConfig",
    "LlamaConfig",
    "ParallelConfig",
    "ProjectionConfig",
    "build_gpt_model",
    "layer_spec",
    "parameter_count",
    "preset",
    "transformer_config",
]
