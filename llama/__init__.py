"""Llama-3.1 models on megatron-core with the ``fp4_attention`` core attention.

    from llama import preset, build_gpt_model, AttentionConfig
    cfg = preset("tiny", attention=AttentionConfig(recipe="nvfp4qk_fp8pv"))
    model = build_gpt_model(cfg)            # after initialize_model_parallel(...)

Modules: ``config`` (typed config, presets, parameter count), ``specs`` (layer specs: TE or local
projections around our core attention), ``builder`` (TransformerConfig + GPTModel), ``cpu_compat``
(megatron-core's CUDA assumptions on a machine without a GPU). The core-attention module itself is
``fp4_attention.megatron``; ``AttentionConfig`` is ``fp4_attention``'s, re-exported.

``builder`` and ``specs`` import megatron-core (seconds, and its warnings about optional packages);
their names here load them on first use, so that the config types (which ``training.config`` uses
for its ``projection`` and ``parallel`` sections) come without megatron-core.
"""

import importlib

from .config import (
    PRESETS,
    AttentionConfig,
    LlamaConfig,
    ParallelConfig,
    ProjectionConfig,
    parameter_count,
    preset,
)

_LAZY = {"build_gpt_model": "builder", "transformer_config": "builder", "layer_spec": "specs"}

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


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
