"""Typed Llama-3.1 model configuration and presets.

One keyword-only dataclass describes the model (shapes, RoPE, init, dtype), the attention
(:class:`fp4_attention.AttentionConfig`, carried unchanged to the core-attention module) and the
projection precision; :class:`ParallelConfig` holds the model-parallel sizes; ``builder.py`` maps
both onto megatron-core. :class:`ProjectionConfig` and :class:`ParallelConfig` are also the
``projection`` and ``parallel`` sections of the training config (``training.config``), so their field
names are the YAML keys and their messages name them. Every ``__post_init__`` raises a ``ValueError``
that says how to fix the value.

Presets (``PRESETS`` / :func:`preset`): ``llama3_1_8b`` (the published 8B shapes), ``small`` (117M,
mostly embeddings, for GPU smoke runs) and ``tiny`` (a few M parameters for CPU tests).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from fp4_attention import AttentionConfig

__all__ = [
    "PRESETS",
    "AttentionConfig",
    "LlamaConfig",
    "ParallelConfig",
    "ProjectionConfig",
    "parameter_count",
    "preset",
]

ProjectionPrecision = Literal["bf16", "te_fp8", "torchao_fp8"]
TransformerImpl = Literal["auto", "transformer_engine", "local"]


@dataclass(frozen=True, kw_only=True)
class ProjectionConfig:
    """Precision of the linear projections (QKV, output, FC1, FC2; the LM head stays BF16).

    Attributes:
        precision: ``bf16``; ``te_fp8`` (Transformer Engine FP8, needs the ``te`` extra);
            ``torchao_fp8`` is rejected by the spec builder with the reason (see ``specs.py``).
        fp8_format: ``e4m3`` (E4M3 everywhere) or ``hybrid`` (E4M3 forward, E5M2 gradients).
        fp8_scaling: ``delayed`` (amax history) or ``current`` (per-tensor current scaling,
            megatron's ``tensorwise``).
        fp8_bf16_first_layers / fp8_bf16_last_layers: transformer layers kept in BF16 at either end
            (current scaling only: TE/megatron reject BF16 first/last layers with delayed scaling).
        fp8_amax_history_len / fp8_amax_compute_algo: delayed scaling's history (NeMo: 1024, max).
        fp8_weight_cache: keep each projection's FP8 weight (row- and column-wise, 2 bytes per
            weight) between steps, quantized once per step at its first micro-batch (megatron-core's
            default, ``disable_parameter_transpose_cache=False``; Transformer Engine's
            ``is_first_microbatch``). ``false`` quantizes the weight in every micro-batch's forward
            and frees it after that micro-batch's backward: the same work when a step has one
            micro-batch, one re-quantization more per extra micro-batch (1.3% of a step with 4,
            ``results/te_h200/``). The copies are alive from forward to backward either way, so
            ``false`` lowers only a peak outside forward/backward (the optimizer step of an unsharded
            optimizer: 4.9 GiB at 12 layers of the 8B shape on one GPU); with pipeline parallelism it
            raises the forward/backward one (a copy per micro-batch in flight). With delayed scaling
            the two differ in numerics: the cache reuses the first micro-batch's quantization.
    """

    precision: ProjectionPrecision = "bf16"
    fp8_format: Literal["e4m3", "hybrid"] = "hybrid"
    fp8_scaling: Literal["delayed", "current"] = "current"
    fp8_bf16_first_layers: int = 0
    fp8_bf16_last_layers: int = 0
    fp8_amax_history_len: int = 1024
    fp8_amax_compute_algo: Literal["max", "most_recent"] = "max"
    fp8_weight_cache: bool = True

    def __post_init__(self):
        if self.precision not in ("bf16", "te_fp8", "torchao_fp8"):
            raise ValueError(f"projection.precision={self.precision!r}; choose bf16, te_fp8 or torchao_fp8")
        if self.fp8_format not in ("e4m3", "hybrid"):
            raise ValueError(f"projection.fp8_format={self.fp8_format!r}; choose e4m3 or hybrid")
        if self.fp8_scaling not in ("delayed", "current"):
            raise ValueError(f"projection.fp8_scaling={self.fp8_scaling!r}; choose delayed or current")
        if self.fp8_amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(
                f"projection.fp8_amax_compute_algo={self.fp8_amax_compute_algo!r}; choose max or most_recent"
            )
        if self.fp8_amax_history_len < 1:
            raise ValueError(f"projection.fp8_amax_history_len must be >= 1, got {self.fp8_amax_history_len}")
        if self.fp8_bf16_first_layers < 0 or self.fp8_bf16_last_layers < 0:
            raise ValueError("projection.fp8_bf16_first_layers / fp8_bf16_last_layers must be >= 0")
        if self.fp8_scaling == "delayed" and (self.fp8_bf16_first_layers or self.fp8_bf16_last_layers):
            raise ValueError(
                "projection: delayed FP8 scaling does not support BF16 first/last layers (Transformer Engine "
                "rule); set fp8_scaling='current' or fp8_bf16_first_layers=fp8_bf16_last_layers=0"
            )


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """Model-parallel sizes (the training config's ``parallel`` section, hence the field names).

    They must match ``megatron.core.parallel_state.initialize_model_parallel``; the data-parallel
    size is the rest of the world, ``world_size / model_parallel_size``.

    Attributes:
        tensor / pipeline / context: tensor-, pipeline- and context-parallel sizes.
        sequence_parallel: megatron's sequence parallelism (needs ``tensor > 1``).
    """

    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    sequence_parallel: bool = False

    def __post_init__(self):
        for name in ("tensor", "pipeline", "context"):
            if getattr(self, name) < 1:
                raise ValueError(f"parallel.{name} must be >= 1, got {getattr(self, name)}")
        if self.sequence_parallel and self.tensor == 1:
            raise ValueError(
                "parallel.sequence_parallel needs parallel.tensor > 1; set sequence_parallel=false"
            )

    @property
    def model_parallel_size(self) -> int:
        return self.tensor * self.pipeline * self.context

    def check_supported(self) -> None:
        """Raise ``ValueError`` for sizes the model cannot run yet (context parallelism).

        Not a ``__post_init__`` check: a config may describe such a layout, so that a run plan can
        report its other problems first (``training.plan``); the builder calls this.
        """
        if self.context > 1:
            raise ValueError(
                f"parallel.context={self.context}: the FP4 core attention does not implement context "
                "parallelism yet; use parallel.context=1 with tensor/pipeline/data parallelism"
            )


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """A Llama-3.1 decoder (untied embeddings, no biases, SwiGLU, RMSNorm, RoPE with Llama-3.1 scaling).

    Attributes:
        num_layers, hidden_size, ffn_hidden_size, vocab_size: shapes.
        num_attention_heads / num_kv_heads: query heads and key/value heads (GQA).
        head_dim: per-head width; ``num_attention_heads * head_dim`` need not equal ``hidden_size``.
        max_seq_length: the longest sequence the model is built for (megatron's max_sequence_length).
        norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base.
        rope_scaling: apply Llama-3.1 frequency scaling; its constants are megatron-core's built-in
            ones (low/high frequency factors 1 and 4, original context 8192), only the factor is
            configurable there, so the other three fields are validated against them.
        init_std: normal init std (output projections of each block use std / sqrt(2 * num_layers)).
        params_dtype: ``bf16`` (megatron ``bf16=True``) or ``fp32``.
        transformer_impl: ``auto`` (TE spec when transformer_engine imports, else local), or forced.
    """

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int = 128256
    max_seq_length: int = 8192
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: bool = True
    rope_scaling_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    init_std: float = 0.02
    params_dtype: Literal["bf16", "fp32"] = "bf16"
    transformer_impl: TransformerImpl = "auto"
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    projection: ProjectionConfig = field(default_factory=ProjectionConfig)

    def __post_init__(self):
        for name in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "ffn_hidden_size",
            "vocab_size",
            "max_seq_length",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for GQA; pick num_kv_heads among its divisors"
            )
        if self.head_dim % 16 or self.head_dim > 256:
            raise ValueError(
                f"head_dim={self.head_dim}: the attention kernels need a multiple of 16 up to 256"
            )
        self.attention.check_head_dim(self.head_dim)  # a Q/K rotation needs a power of two
        if not (self.norm_eps > 0):
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps}")
        if not (self.rope_theta > 0):
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if not (self.init_std > 0):
            raise ValueError(f"init_std must be > 0, got {self.init_std}")
        if self.params_dtype not in ("bf16", "fp32"):
            raise ValueError(f"params_dtype={self.params_dtype!r}; choose bf16 or fp32")
        if self.transformer_impl not in ("auto", "transformer_engine", "local"):
            raise ValueError(
                f"transformer_impl={self.transformer_impl!r}; choose auto, transformer_engine or local"
            )
        if self.rope_scaling:
            if not self.rope_scaling_factor >= 1:
                raise ValueError(f"rope_scaling_factor must be >= 1, got {self.rope_scaling_factor}")
            fixed = {
                "rope_low_freq_factor": 1.0,
                "rope_high_freq_factor": 4.0,
                "rope_original_max_position": 8192,
            }
            for name, value in fixed.items():
                if getattr(self, name) != value:
                    raise ValueError(
                        f"{name}={getattr(self, name)}: megatron-core's Llama-3.1 RoPE scaling hard-codes "
                        f"{value} "
                        f"(only the factor is configurable); set {name}={value} or rope_scaling=False"
                    )
        if self.projection.precision == "te_fp8":
            n_bf16 = self.projection.fp8_bf16_first_layers + self.projection.fp8_bf16_last_layers
            if n_bf16 > self.num_layers:
                raise ValueError(
                    f"projection keeps {n_bf16} layers in BF16 but the model has {self.num_layers}; "
                    "lower fp8_bf16_first_layers / fp8_bf16_last_layers"
                )
            if self.params_dtype != "bf16":
                raise ValueError(
                    "projection.precision='te_fp8' trains with BF16 params; set params_dtype='bf16'"
                )

    def builds_te_spec(self, te_available: bool) -> bool:
        """Whether the layer spec is Transformer Engine's (else megatron-core's local one), given whether
        TE is usable: TE for ``te_fp8`` or ``transformer_impl='transformer_engine'``, local for
        ``'local'``, and for ``'auto'`` TE when available. The rule only:
        ``llama.specs.uses_transformer_engine`` adds its errors (TE required but missing, ``te_fp8``
        with ``'local'``), and the dry run's memory estimate (``training.plan.layer_spec_of``) asks it
        without importing megatron-core."""
        if self.projection.precision == "te_fp8" or self.transformer_impl == "transformer_engine":
            return True
        return te_available and self.transformer_impl == "auto"

    def replace(self, **changes) -> LlamaConfig:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)


def parameter_count(config: LlamaConfig) -> int:
    """Number of parameters of the model ``config`` describes (untied embeddings, no biases).

    embeddings V*h + output V*h + L * (qkv h*(Hq + 2*Hkv)*d + o Hq*d*h + fc1 h*2*f + fc2 f*h + 2 norms h)
    + final norm h.
    """
    h, d, f, v = config.hidden_size, config.head_dim, config.ffn_hidden_size, config.vocab_size
    hq, hkv = config.num_attention_heads, config.num_kv_heads
    per_layer = h * (hq + 2 * hkv) * d + hq * d * h + h * 2 * f + f * h + 2 * h
    return 2 * v * h + config.num_layers * per_layer + h


def _llama3_1_8b(**overrides) -> LlamaConfig:
    shapes = {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "ffn_hidden_size": 14336,
        "vocab_size": 128256,
        "max_seq_length": 8192,
    }
    return LlamaConfig(**{**shapes, **overrides})


def _small(**overrides) -> LlamaConfig:
    # 117.4M parameters with the Llama-3 vocabulary (98.5M of them in the two embedding tables).
    shapes = {
        "num_layers": 12,
        "hidden_size": 384,
        "num_attention_heads": 6,
        "num_kv_heads": 2,
        "head_dim": 64,
        "ffn_hidden_size": 1024,
        "vocab_size": 128256,
        "max_seq_length": 2048,
    }
    return LlamaConfig(**{**shapes, **overrides})


def _tiny(**overrides) -> LlamaConfig:
    # 2.6M parameters, small vocabulary, GQA 2: builds, runs forward and backward on CPU in about a second.
    shapes = {
        "num_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 64,
        "ffn_hidden_size": 768,
        "vocab_size": 2048,
        "max_seq_length": 256,
    }
    return LlamaConfig(**{**shapes, **overrides})


PRESETS = {"llama3_1_8b": _llama3_1_8b, "small": _small, "tiny": _tiny}


def preset(name: str, **overrides) -> LlamaConfig:
    """A preset config, with keyword ``overrides`` (e.g. ``attention=AttentionConfig(recipe="fp8")``).

    Raises:
        ValueError: unknown preset (lists them) or an invalid override.
    """
    try:
        factory = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}") from None
    return factory(**overrides)
