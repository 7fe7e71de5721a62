"""megatron-core core attention backed by :func:`fp4_attention.attention`.

It fills the ``core_attention`` slot of megatron-core's ``SelfAttention`` (0.16-0.19)::

    from megatron.core.transformer.spec_utils import ModuleSpec
    spec.submodules.self_attention.submodules.core_attention = ModuleSpec(
        module=FP4CoreAttention, params={"attention": AttentionConfig(recipe="nvfp4qk_fp8pv")})

``attention`` (an :class:`~fp4_attention.AttentionConfig`, the one config type from the YAML section
to the kernel) is the only extra constructor keyword: it does not collide with the ones
``Attention`` passes (``config, layer_number, attn_mask_type, attention_type, cp_comm_type,
softmax_scale, pg_collection``). A backend ``auto`` goes to :func:`~fp4_attention.attention`, which
resolves it once per recipe and device (a training job resolves it before building the model and
logs why).

Contract (megatron-core's): query ``[sq, b, np, hn]``, key/value ``[sk, b, ng, hn]`` with the heads of
this tensor-parallel rank only and GQA not expanded, possibly non-contiguous, RoPE already applied;
returns ``[sq, b, np * hn]``. We pass them to ``attention(..., layout="sbhd")`` as they are.

Decisions:

* Masks. Causality comes from ``attn_mask_type`` (``causal`` / ``padding_causal`` -> causal,
  ``no_mask`` -> not). ``attention_mask`` (boolean, True = masked) may be None; if given, it must be
  exactly the causal mask for a causal mask type (or all False otherwise), else ValueError: the
  kernels take no arbitrary masks. Checking costs one ``[sq, sk]`` comparison per layer: let the data
  loader create no masks (megatron's ``create_attention_mask=False``) to skip it.
* Dtype. Every recipe quantizes from BF16, so a query/key/value in another float dtype (an FP32
  model in CPU tests) is cast to BF16 on entry, and the output cast back to the query's dtype. A
  BF16 model (the real configuration) casts nothing. Gradients flow through the casts.
* Not supported, with an error naming the alternative: context parallelism > 1 (the module would
  see only its sequence shard and compute wrong attention silently), packed sequences
  (``packed_seq_params``), attention bias, sliding windows, non-vanilla softmax, attention dropout.
* ``apply_query_key_layer_scaling`` is an FP16 overflow trick that cancels exactly (scale / layer,
  then softmax input x layer); it does not change the result, so it is ignored.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule

from .config import AttentionConfig
from .interface import attention

__all__ = ["FP4CoreAttention"]

_CAUSAL_TYPES = (AttnMaskType.causal, AttnMaskType.padding_causal, AttnMaskType.causal_bottom_right)
_NON_CAUSAL_TYPES = (AttnMaskType.no_mask, AttnMaskType.padding)


class FP4CoreAttention(MegatronModule):
    """megatron-core core attention running one ``fp4_attention`` recipe (see the module docstring)."""

    def __init__(
        self,
        *,
        config,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        cp_comm_type: str | None = None,
        softmax_scale: float | None = None,
        pg_collection=None,
        attention: AttentionConfig | None = None,
    ):
        super().__init__(config=config)
        attention = attention if attention is not None else AttentionConfig()
        if not isinstance(attention, AttentionConfig):
            raise TypeError(
                f"attention must be an fp4_attention.AttentionConfig, got {type(attention).__name__}"
            )
        _check_config(config, pg_collection)
        if attention_type != "self":
            raise ValueError(
                f"FP4CoreAttention supports self-attention only, got attention_type={attention_type!r}"
            )
        self.attention = attention
        self.recipe = attention.get_recipe()  # with the config's Q/K rotation, if any
        self.layer_number = layer_number
        self.attn_mask_type = attn_mask_type
        self.softmax_scale = softmax_scale  # None: D ** -0.5 (the library's default, and megatron's)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if packed_seq_params is not None:
            raise NotImplementedError(
                "FP4CoreAttention does not support packed sequences (packed_seq_params / THD) yet: feed "
                "[s, b] batches of whole sequences (no THD packing, no reset_attention_mask)"
            )
        if attention_bias is not None:
            raise NotImplementedError(
                "FP4CoreAttention does not support attention_bias; use no bias (Llama has none)"
            )
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal = _is_causal(mask_type)
        if attention_mask is not None:
            _check_mask(attention_mask, causal, query.shape[0], key.shape[0], query.shape[1])
        out_dtype = query.dtype
        q, k, v = (t if t.dtype == torch.bfloat16 else t.to(torch.bfloat16) for t in (query, key, value))
        out = attention(
            q,
            k,
            v,
            recipe=self.recipe,
            causal=causal,
            softmax_scale=self.softmax_scale,
            layout="sbhd",
            backend=self.attention.backend,
            **self.attention.options,
        )
        sq, b = query.shape[0], query.shape[1]
        return out.reshape(sq, b, -1).to(out_dtype)

    def extra_repr(self) -> str:
        return (
            f"recipe={self.recipe.label}, backend={self.attention.backend}, "
            f"attn_mask_type={self.attn_mask_type.name}, layer={self.layer_number}"
        )


def _check_config(config, pg_collection) -> None:
    cp = getattr(config, "context_parallel_size", 1)
    if pg_collection is not None and getattr(pg_collection, "cp", None) is not None:
        cp = max(cp, pg_collection.cp.size())
    if cp > 1:
        raise NotImplementedError(
            f"FP4CoreAttention does not implement context parallelism (context_parallel_size={cp}): each "
            "rank "
            "would attend within its own sequence shard and compute wrong attention silently; set "
            "context_parallel_size=1 and use tensor/pipeline/data parallelism (or shorter sequences)"
        )
    if getattr(config, "softmax_type", "vanilla") != "vanilla":
        raise NotImplementedError(
            f"FP4CoreAttention supports softmax_type='vanilla' only, got {config.softmax_type!r}"
        )
    if getattr(config, "window_size", None) is not None:
        raise NotImplementedError("FP4CoreAttention has no sliding-window attention; set window_size=None")
    if getattr(config, "attention_dropout", 0.0):
        raise ValueError(
            f"FP4CoreAttention has no attention dropout; set attention_dropout=0.0 "
            f"(got {config.attention_dropout})"
        )


def _is_causal(mask_type: AttnMaskType) -> bool:
    if mask_type in _CAUSAL_TYPES:
        return True
    if mask_type in _NON_CAUSAL_TYPES:
        return False
    raise NotImplementedError(
        f"FP4CoreAttention supports causal and unmasked attention only, got attn_mask_type={mask_type}; "
        "use AttnMaskType.causal (arbitrary masks are not supported by the kernels)"
    )


def _check_mask(mask: torch.Tensor, causal: bool, sq: int, sk: int, b: int) -> None:
    """Accept ``mask`` only if it equals what ``causal`` already implies (True = masked)."""
    if (
        mask.dtype != torch.bool
        or mask.dim() != 4
        or mask.shape[-2:] != (sq, sk)
        or mask.shape[1] != 1
        or mask.shape[0] not in (1, b)
    ):
        raise ValueError(
            f"attention_mask must be a boolean [b or 1, 1, {sq}, {sk}] tensor (True = masked), got "
            f"{mask.dtype} {tuple(mask.shape)}; pass attention_mask=None and let attn_mask_type carry "
            "causality"
        )
    i = torch.arange(sq, device=mask.device)[:, None]
    j = torch.arange(sk, device=mask.device)[None, :]
    expected = (j > i + (sk - sq)) if causal else torch.zeros(sq, sk, dtype=torch.bool, device=mask.device)
    if not bool((mask == expected).all()):
        kind = "the (bottom-right aligned) causal mask" if causal else "no masking"
        raise ValueError(
            f"FP4CoreAttention got an attention_mask that is not {kind}: arbitrary masks (padding, document "
            "masks) are not supported; pass attention_mask=None (create_attention_mask=False in the dataset "
            "config) and use attn_mask_type=causal"
        )
