"""Build a megatron-core GPTModel for a :class:`~llama.config.LlamaConfig` (keyword arguments only).

megatron-core reorders positional arguments between releases, so every call below passes keywords.
What maps where:

| LlamaConfig                          | megatron-core                                                  |
|--------------------------------------|----------------------------------------------------------------|
| shapes, ``num_kv_heads``, ``head_dim`` | TransformerConfig ``num_query_groups``, ``kv_channels``       |
| RMSNorm ``norm_eps``                 | ``normalization="RMSNorm"``, ``layernorm_epsilon``             |
| SwiGLU FFN                           | ``gated_linear_unit=True``, ``activation_func=F.silu``         |
| no biases                            | ``add_bias_linear=False``, ``add_qkv_bias=False``              |
| ``init_std``                         | ``init_method_std`` (output projections: std/sqrt(2L))         |
| ``params_dtype``                     | ``bf16`` / ``params_dtype`` / ``pipeline_dtype``               |
| RoPE                                 | GPTModel ``position_embedding_type="rope"``, ``rotary_base``,  |
|                                      | ``rope_scaling``, ``rope_scaling_factor``                      |
| untied embeddings                    | GPTModel ``share_embeddings_and_output_weights=False``         |
| ``projection`` te_fp8                | ``fp8`` (format), ``fp8_recipe`` (delayed / tensorwise),       |
|                                      | ``first_last_layers_bf16`` ...                                 |

Dropout is 0 everywhere (Llama pretraining; our attention has none). Fusions that need Apex or TE
(RoPE, bias-activation, gradient-accumulation, persistent layer norm) are off unless TE is used.
Without a GPU, weights are initialised through megatron-core's CPU path (``use_cpu_initialization``);
the forward pass then also needs ``llama.cpu_compat``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from .config import LlamaConfig, ParallelConfig
from .specs import layer_spec as build_layer_spec
from .specs import uses_transformer_engine

__all__ = ["build_gpt_model", "fp8_settings", "transformer_config"]

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def transformer_config(
    config: LlamaConfig,
    *,
    parallel: ParallelConfig | None = None,
    use_cpu_initialization: bool | None = None,
    perform_initialization: bool = True,
) -> TransformerConfig:
    """megatron-core's TransformerConfig for ``config``.

    Args:
        parallel: model-parallel sizes (default: all 1); sizes the model cannot run raise ValueError.
        use_cpu_initialization: default: True exactly when no GPU is available.
        perform_initialization: False skips weight init (e.g. before loading a checkpoint, or on meta).
    """
    parallel = parallel if parallel is not None else ParallelConfig()
    parallel.check_supported()
    te = uses_transformer_engine(config)
    dtype = _DTYPES[config.params_dtype]
    if use_cpu_initialization is None:
        use_cpu_initialization = not torch.cuda.is_available()
    return TransformerConfig(
        num_layers=config.num_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        num_query_groups=config.num_kv_heads,
        kv_channels=config.head_dim,
        ffn_hidden_size=config.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=config.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=config.init_std,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        tensor_model_parallel_size=parallel.tensor,
        pipeline_model_parallel_size=parallel.pipeline,
        context_parallel_size=parallel.context,
        sequence_parallel=parallel.sequence_parallel,
        use_cpu_initialization=use_cpu_initialization,
        perform_initialization=perform_initialization,
        apply_rope_fusion=te,
        bias_activation_fusion=te,
        bias_dropout_fusion=te,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        **fp8_settings(config),
    )


def fp8_settings(config: LlamaConfig) -> dict:
    """The TransformerConfig FP8 keywords for ``config.projection`` (empty unless ``te_fp8``)."""
    proj = config.projection
    if proj.precision != "te_fp8":
        return {}
    kwargs = {
        "fp8": proj.fp8_format,
        "fp8_recipe": "delayed" if proj.fp8_scaling == "delayed" else "tensorwise",
        "disable_parameter_transpose_cache": not proj.fp8_weight_cache,
    }
    if proj.fp8_scaling == "delayed":
        kwargs.update(
            fp8_amax_history_len=proj.fp8_amax_history_len, fp8_amax_compute_algo=proj.fp8_amax_compute_algo
        )
    if proj.fp8_bf16_first_layers or proj.fp8_bf16_last_layers:
        kwargs.update(
            first_last_layers_bf16=True,
            num_layers_at_start_in_bf16=proj.fp8_bf16_first_layers,
            num_layers_at_end_in_bf16=proj.fp8_bf16_last_layers,
        )
    return kwargs


def build_gpt_model(
    config: LlamaConfig,
    *,
    parallel: ParallelConfig | None = None,
    layer_spec: ModuleSpec | None = None,
    pre_process: bool = True,
    post_process: bool = True,
    use_cpu_initialization: bool | None = None,
    perform_initialization: bool = True,
    vp_stage: int | None = None,
) -> GPTModel:
    """A megatron-core GPTModel implementing ``config``.

    Needs ``torch.distributed`` and ``parallel_state.initialize_model_parallel`` with the sizes in
    ``parallel`` (a one-process gloo group is enough on CPU). The model is on the current CUDA device
    when there is one, else on CPU (built under ``torch.device("meta")`` it stays there). With
    ``params_dtype='bf16'`` every parameter is BF16 (as after megatron's ``Float16Module``, which the
    trainer may still apply).

    Args:
        parallel: model-parallel sizes; checked against the initialized groups.
        layer_spec: override the transformer-layer spec (default :func:`llama.specs.layer_spec`).
        pre_process / post_process: pipeline first / last stage (embedding / LM head).
        use_cpu_initialization, perform_initialization: see :func:`transformer_config`.
        vp_stage: virtual pipeline stage, passed through.
    Raises:
        ValueError: parallel sizes the model cannot run or that disagree with the initialized groups,
            or precision/spec errors.
    """
    parallel = parallel if parallel is not None else ParallelConfig()
    _check_parallel_state(parallel)
    tc = transformer_config(
        config,
        parallel=parallel,
        use_cpu_initialization=use_cpu_initialization,
        perform_initialization=perform_initialization,
    )
    spec = layer_spec if layer_spec is not None else build_layer_spec(config)
    model = GPTModel(
        config=tc,
        transformer_layer_spec=spec,
        vocab_size=config.vocab_size,
        max_sequence_length=config.max_seq_length,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=int(config.rope_theta) if float(config.rope_theta).is_integer() else config.rope_theta,
        rope_scaling=config.rope_scaling,
        rope_scaling_factor=config.rope_scaling_factor,
        vp_stage=vp_stage,
    )
    # The local spec's torch RMSNorm ignores both params_dtype and the device (FP32, CPU); Megatron-LM's
    # get_model moves every model with .cuda() and Float16Module casts it to BF16. Do the same here, so
    # the bare model is uniformly on one device and in params_dtype.
    if not any(p.is_meta for p in model.parameters()):
        dev = (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        model.to(device=dev)
    if tc.params_dtype == torch.bfloat16:
        model.bfloat16()
    return model


def _check_parallel_state(parallel: ParallelConfig) -> None:
    if not parallel_state.model_parallel_is_initialized():
        raise ValueError(
            "megatron-core model parallelism is not initialized: call torch.distributed."
            "init_process_group and parallel_state.initialize_model_parallel(tensor_model_parallel_size="
            "..., pipeline_model_parallel_size=...) before building the model"
        )
    got = (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_pipeline_model_parallel_world_size(),
        parallel_state.get_context_parallel_world_size(),
    )
    want = (parallel.tensor, parallel.pipeline, parallel.context)
    if got != want:
        raise ValueError(
            f"ParallelConfig (tp, pp, cp)={want} but megatron-core was initialized with {got}; "
            "pass the same sizes to both"
        )
