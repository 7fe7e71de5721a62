"""Transformer-layer specs: megatron-core's Llama layer with our core attention in its slot.

* Transformer Engine importable (and ``transformer_impl`` ``auto`` or ``transformer_engine``):
  megatron-core's TE spec. RMSNorm is fused into ``linear_qkv`` / ``linear_fc1``
  (``TELayerNormColumnParallelLinear``), ``linear_proj`` / ``linear_fc2`` are ``TERowParallelLinear``.
  Projection precision ``te_fp8`` is set on the TransformerConfig (``builder.py``): TE then runs these
  projections in FP8 inside its autocast, while our attention (not a TE module) keeps its own recipe.
* Otherwise: megatron-core's local spec (``ColumnParallelLinear`` / ``RowParallelLinear``, torch
  RMSNorm), same attention.

``torchao_fp8`` is rejected: torchao's float8 training (``convert_to_float8_training``) swaps
``torch.nn.Linear`` modules for ``Float8Linear``; megatron-core's ``ColumnParallelLinear`` /
``RowParallelLinear`` are not ``nn.Linear`` (they subclass ``nn.Module``, return ``(output, bias)``
and run their own autograd function with the tensor-parallel communication and gradient
accumulation inside), so nothing would be swapped, and making them FP8 means reimplementing their
forward/backward around torchao's scaled matmul. torchtitan's torchao+TP route works only with
DTensor tensor parallelism, not megatron's. Use ``te_fp8`` (needs TE) or ``bf16``.
"""

from __future__ import annotations

import dataclasses
import importlib.util

from megatron.core.transformer.spec_utils import ModuleSpec

from fp4_attention.megatron import FP4CoreAttention, FP4SelfAttention

from .config import LlamaConfig

__all__ = ["core_attention_spec", "have_transformer_engine", "layer_spec", "uses_transformer_engine"]

TORCHAO_FP8_UNSUPPORTED = (
    "projection.precision='torchao_fp8' is not supported: torchao's float8 training swaps torch.nn.Linear "
    "modules, and megatron-core's ColumnParallelLinear/RowParallelLinear are not nn.Linear (they carry the "
    "tensor-parallel communication inside their own autograd function), so FP8 there would mean "
    "reimplementing them. Use precision='te_fp8' (pip install -e '.[te]') or 'bf16'."
)


def have_transformer_engine() -> bool:
    """Whether megatron-core found a usable Transformer Engine (its own ``HAVE_TE``)."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    from megatron.core.extensions.transformer_engine import HAVE_TE

    return bool(HAVE_TE)


def uses_transformer_engine(config: LlamaConfig) -> bool:
    """Resolve ``config.transformer_impl`` (and the projection precision) to TE or local.

    Raises:
        ValueError: TE is required (``transformer_impl='transformer_engine'`` or ``te_fp8``) but not
            importable, or ``te_fp8`` with ``transformer_impl='local'``, or ``torchao_fp8``.
    """
    precision = config.projection.precision
    if precision == "torchao_fp8":
        raise ValueError(TORCHAO_FP8_UNSUPPORTED)
    te = have_transformer_engine()
    needs_te = config.transformer_impl == "transformer_engine" or precision == "te_fp8"
    if needs_te and not te:
        why = (
            "projection.precision='te_fp8'"
            if precision == "te_fp8"
            else "transformer_impl='transformer_engine'"
        )
        raise ValueError(
            f"{why} needs Transformer Engine, which is not importable: install the 'te' extra "
            "(pip install -e '.[te]', needs a CUDA toolchain) or use precision='bf16' with "
            "transformer_impl='auto'"
        )
    if precision == "te_fp8" and config.transformer_impl == "local":
        raise ValueError(
            "projection.precision='te_fp8' needs the Transformer Engine spec; set "
            "transformer_impl='auto' or 'transformer_engine'"
        )
    return config.builds_te_spec(te)


def core_attention_spec(config: LlamaConfig) -> ModuleSpec:
    """Our core attention running ``config.attention`` (an :class:`fp4_attention.AttentionConfig`)."""
    return ModuleSpec(module=FP4CoreAttention, params={"attention": config.attention})


def layer_spec(config: LlamaConfig, *, core_attention: ModuleSpec | type | None = None) -> ModuleSpec:
    """The transformer-layer spec for ``config``.

    Args:
        core_attention: what to put in the core-attention slot; default our attention
            (:func:`core_attention_spec`), with :class:`fp4_attention.megatron.FP4SelfAttention` as
            the self-attention module when ``config.attention.fuse_rope`` is set. Tests pass
            megatron-core's ``DotProductAttention`` to compare against its own attention path (on
            a CPU with an explicit causal mask: its default one is made on CUDA, see
            :mod:`llama.cpu_compat`).

    Raises:
        ValueError: another ``core_attention`` with ``config.attention.fuse_rope`` (RoPE would not
            be fused), or as :func:`uses_transformer_engine`.
    """
    if uses_transformer_engine(config):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=False)
    else:
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        spec = get_gpt_layer_local_spec(qk_layernorm=False, normalization="RMSNorm")
    if config.attention.fuse_rope and core_attention is not None:
        raise ValueError(
            "attention.fuse_rope needs our core attention (FP4CoreAttention applies RoPE); with another "
            "core_attention set attention.fuse_rope=false"
        )
    slot = core_attention if core_attention is not None else core_attention_spec(config)
    # attention.fuse_rope: RoPE applied by our core attention, not by megatron-core's SelfAttention
    module = FP4SelfAttention if config.attention.fuse_rope else None
    return _with_core_attention(spec, slot, self_attention=module)


def _with_core_attention(
    spec: ModuleSpec, core_attention: ModuleSpec | type, *, self_attention: type | None = None
) -> ModuleSpec:
    """A copy of a layer ``spec`` whose ``self_attention.submodules.core_attention`` is replaced (and
    ``self_attention.module`` by ``self_attention`` when given)."""
    attn = spec.submodules.self_attention
    attn_sub = dataclasses.replace(attn.submodules, core_attention=core_attention)
    new_attn = dataclasses.replace(attn, submodules=attn_sub)
    if self_attention is not None:
        new_attn = dataclasses.replace(new_attn, module=self_attention)
    return dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, self_attention=new_attn))
