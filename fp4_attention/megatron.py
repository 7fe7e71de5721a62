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

RoPE inside the attention (``AttentionConfig.fuse_rope``): :class:`FP4SelfAttention`, megatron-core's
``SelfAttention`` with one change: it does not apply RoPE to Q and K but hands the step's RoPE
tables to its :class:`FP4CoreAttention`, which passes them to ``attention(..., rope=...)``, where
the Q/K quantizers of ``fp8`` and ``nvfp4qk_fp8pv`` apply it to the rows they load (the roped BF16
Q/K are never written). Put it in the layer spec's ``self_attention.module``
(``llama.specs.layer_spec`` does when ``attention.fuse_rope`` is set; our core attention with
``fuse_rope`` under another self-attention module raises). The tables come from megatron-core's
``rotary_pos_emb`` (freqs ``[s, 1, 1, D]`` = ``cat(theta, theta)``, non-interleaved):
``theta = freqs[:, 0, 0, :D/2]``, built once per freqs tensor (megatron-core caches the tensor per
sequence length, so once per run).
Layers that ``config.no_rope_freq`` marks get no RoPE, as in megatron-core. Selective recomputation
of the core attention passes the tables into its recompute (``core_attention_extra_kwargs``,
megatron-core 0.19). Refused, with the alternative (``fuse_rope: false``): interleaved RoPE,
``fused_single_qkv_rope``, partial rotary (``rotary_percent`` < 1), YaRN's mscale, freqs that are not
``cat(theta, theta)``, inference (KV cache, flash decode).

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

import inspect
import weakref

import torch
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule

from .config import AttentionConfig
from .interface import attention
from .numerics.rope import RoPETables

__all__ = ["FP4CoreAttention", "FP4SelfAttention", "rope_tables_of"]

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
        # set by an FP4SelfAttention around each of its forwards: (RoPETables or None,); None outside
        self.rope_slot: tuple[RoPETables | None] | None = None
        self.rope_from_parent = False  # FP4SelfAttention sets it: every call must then come with a slot
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
        rope_slot: tuple | None = None,
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
        rope = None
        if self.attention.fuse_rope and not self.rope_from_parent:
            raise RuntimeError(
                "FP4CoreAttention with attention.fuse_rope=true needs FP4SelfAttention as its self-attention "
                "module (llama.specs.layer_spec puts it there); under megatron-core's SelfAttention RoPE "
                "would not be fused"
            )
        if rope_slot is None:  # FP4SelfAttention's recompute passes the slot of its forward
            rope_slot = self.rope_slot
        if self.rope_from_parent:
            if rope_slot is None:
                raise RuntimeError(
                    "FP4CoreAttention under FP4SelfAttention was called without its RoPE tables (outside "
                    "FP4SelfAttention.forward: a recompute of the core attention alone?); recompute the "
                    "whole layer or set attention.fuse_rope=false"
                )
            (rope,) = rope_slot
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
            rope=rope,
            **self.attention.options,
        )
        sq, b = query.shape[0], query.shape[1]
        return out.reshape(sq, b, -1).to(out_dtype)

    def extra_repr(self) -> str:
        return (
            f"recipe={self.recipe.label}, backend={self.attention.backend}, "
            f"attn_mask_type={self.attn_mask_type.name}, layer={self.layer_number}"
        )


class FP4SelfAttention(SelfAttention):
    """megatron-core ``SelfAttention`` whose RoPE is applied inside :class:`FP4CoreAttention` (module
    docstring). Construction and keywords are ``SelfAttention``'s; its core attention must be an
    :class:`FP4CoreAttention` whose config has ``fuse_rope=True``.

    Raises:
        ValueError / NotImplementedError (construction): another core attention, ``fuse_rope`` off,
            interleaved RoPE, ``fused_single_qkv_rope``, YaRN's mscale, or selective recomputation of
            the core attention with a megatron-core that cannot pass it the tables (before 0.19);
        NotImplementedError (forward): inference (a KV cache / inference context, flash decode's
            cos/sin), partial rotary (freqs narrower than the head dim).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        core = self.core_attention
        if not isinstance(core, FP4CoreAttention) or not core.attention.fuse_rope:
            raise ValueError(
                "FP4SelfAttention hands RoPE to its core attention: it needs an FP4CoreAttention with "
                "attention.fuse_rope=true (use megatron-core's SelfAttention otherwise)"
            )
        why = None
        if self.checkpoint_core_attention and not _CHECKPOINT_TAKES_EXTRA_KWARGS:
            why = (
                "selective recomputation of the core attention (recompute_modules has 'core_attn') needs "
                "megatron-core's core_attention_extra_kwargs (0.19) to carry the RoPE tables into the "
                "recompute; recompute the whole layer (recompute_granularity='full')"
            )
        elif getattr(self.config, "rotary_interleaved", False):
            why = "interleaved RoPE (rotary_interleaved=True) is not the layout the kernels rotate"
        elif getattr(self, "_yarn_concentration_factor", None) not in (None, 1.0):
            why = "YaRN's mscale is not implemented in the fused RoPE"
        elif getattr(self.config, "fused_single_qkv_rope", False):
            why = "fused_single_qkv_rope (TE's RoPE fused into the QKV split) applies RoPE itself"
        if why:
            raise NotImplementedError(f"attention.fuse_rope: {why}; or set attention.fuse_rope=false")
        core.rope_from_parent = True
        # megatron-core's layers without RoPE (config.no_rope_freq; layer_number counts from 1)
        no_rope = getattr(self.config, "no_rope_freq", None)
        self.no_rope = bool(no_rope[self.layer_number - 1]) if no_rope else False

    def forward(
        self,
        hidden_states,
        attention_mask,
        key_value_states=None,
        inference_context=None,
        rotary_pos_emb=None,
        rotary_pos_cos=None,
        rotary_pos_sin=None,
        rotary_pos_cos_sin=None,
        attention_bias=None,
        packed_seq_params=None,
        sequence_len_offset=None,
        *,
        inference_params=None,
    ):
        """megatron-core's ``Attention.forward`` (same arguments; hidden states ``[s, b, h]`` in,
        ``(output [s, b, h], bias)`` out) with ``rotary_pos_emb`` (freqs ``[s, 1, 1, D]`` or a
        ``(q, k)`` pair, or None) handed to the core attention as RoPE tables instead of applied
        here; none for a layer that ``config.no_rope_freq`` marks.

        Raises:
            NotImplementedError: an inference context (KV cache), or RoPE as precomputed cos/sin
                (flash decode); partial rotary (:func:`rope_tables_of`).
        """
        if inference_context is not None or inference_params is not None:
            raise NotImplementedError(
                "FP4SelfAttention (attention.fuse_rope) is for training: no inference context / KV cache; "
                "build the model with attention.fuse_rope=false for inference"
            )
        if any(t is not None for t in (rotary_pos_cos, rotary_pos_sin, rotary_pos_cos_sin)):
            raise NotImplementedError(
                "FP4SelfAttention takes RoPE as rotary_pos_emb (freqs), not as precomputed cos/sin (flash "
                "decode); set attention.fuse_rope=false"
            )
        tables = None
        if rotary_pos_emb is not None and not self.no_rope:
            tables = rope_tables_of(rotary_pos_emb, self.config.kv_channels)
        self.core_attention.rope_slot = (tables,)
        try:
            return super().forward(
                hidden_states,
                attention_mask,
                key_value_states=key_value_states,
                rotary_pos_emb=None,  # applied by the core attention
                attention_bias=attention_bias,
                packed_seq_params=packed_seq_params,
                sequence_len_offset=sequence_len_offset,
            )
        finally:
            self.core_attention.rope_slot = None

    def _checkpointed_attention_forward(self, *args, core_attention_extra_kwargs=None, **kwargs):
        """megatron-core's selective recomputation of the core attention, with this forward's RoPE
        tables passed to the core attention as a keyword (``rope_slot``): the recompute, which runs
        in the backward after :meth:`forward` has returned, then uses the same tables."""
        extra = {**(core_attention_extra_kwargs or {}), "rope_slot": self.core_attention.rope_slot}
        return super()._checkpointed_attention_forward(*args, core_attention_extra_kwargs=extra, **kwargs)


# megatron-core 0.19's _checkpointed_attention_forward passes extra keywords to the core attention
# (older releases do not: selective recompute of the core attention is then refused)
_CHECKPOINT_TAKES_EXTRA_KWARGS = (
    "core_attention_extra_kwargs"
    in inspect.signature(SelfAttention._checkpointed_attention_forward).parameters
)

# id(freqs) -> (weak reference to freqs, its version counter, its tables): megatron-core's
# RotaryEmbedding returns one cached tensor per sequence length, so the tables are built once
_TABLES: dict[int, tuple] = {}
_TABLES_MAX = 8


def rope_tables_of(rotary_pos_emb, head_dim: int) -> RoPETables:
    """The :class:`RoPETables` of megatron-core's ``rotary_pos_emb``: freqs ``[s, 1, 1, D]`` (FP32,
    ``cat(theta, theta)``), or a ``(q_freqs, k_freqs)`` pair; built once per freqs tensor (while it
    lives and is not modified in place).

    Raises:
        NotImplementedError: freqs narrower than ``head_dim`` (partial rotary, ``rotary_percent`` < 1).
        ValueError / TypeError: freqs of another shape or dtype (``RoPETables.from_angles``), or whose
            halves differ (another RoPE layout; checked when a tensor is first seen).
    """
    pair = rotary_pos_emb if isinstance(rotary_pos_emb, tuple) else (rotary_pos_emb, rotary_pos_emb)
    q_emb, k_emb = pair
    distinct = (q_emb,) if k_emb is q_emb else pair  # self-attention: one tensor, checked once
    for emb in distinct:
        if emb.dim() != 4 or emb.shape[1:3] != (1, 1):
            raise ValueError(
                f"rotary_pos_emb must be megatron-core's [s, 1, 1, D] freqs, got {tuple(emb.shape)}"
            )
        if emb.shape[-1] != head_dim:
            raise NotImplementedError(
                f"attention.fuse_rope rotates the whole head (D={head_dim}); rotary_pos_emb covers "
                f"{emb.shape[-1]} channels (rotary_percent < 1): set rotary_percent=1.0 or "
                "attention.fuse_rope=false"
            )
    half = head_dim // 2
    inference = torch.is_inference_mode_enabled() or q_emb.is_inference() or k_emb.is_inference()
    if not inference:
        key = (id(q_emb), id(k_emb))
        hit = _TABLES.get(key)
        if hit is not None:
            ref_q, ref_k, versions, tables = hit
            if ref_q() is q_emb and ref_k() is k_emb and versions == (q_emb._version, k_emb._version):
                return tables
    for emb in distinct:  # once per freqs tensor: megatron-core's non-interleaved layout, cat(theta, theta)
        if not torch.equal(emb[..., :half], emb[..., half:]):
            raise ValueError(
                "attention.fuse_rope: rotary_pos_emb is not cat(theta, theta) over the head dim (megatron-"
                "core's non-interleaved RoPE); set attention.fuse_rope=false for this RoPE layout"
            )
    theta_q = q_emb[:, 0, 0, :half]
    theta_k = None if k_emb is q_emb else k_emb[:, 0, 0, :half]
    tables = RoPETables.from_angles(theta_q, theta_k)
    if inference:  # inference tensors have no version counter, and tables made here cannot be saved
        return tables  # for a backward: built for this call only, not cached
    if len(_TABLES) >= _TABLES_MAX:
        _TABLES.clear()
    _TABLES[key] = (weakref.ref(q_emb), weakref.ref(k_emb), (q_emb._version, k_emb._version), tables)
    return tables


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
