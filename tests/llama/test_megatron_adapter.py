"""FP4CoreAttention against megatron-core's core-attention contract."""

from __future__ import annotations

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

import fp4_attention as fa
from fp4_attention import AttentionConfig
from fp4_attention.megatron import FP4CoreAttention

from .conftest import causal_mask

NP, NG, HN = 4, 2, 64


def _config(**kw) -> TransformerConfig:
    base = {
        "num_layers": 2,
        "hidden_size": NP * HN,
        "num_attention_heads": NP,
        "num_query_groups": NG,
        "kv_channels": HN,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "bf16": True,
        "params_dtype": torch.bfloat16,
    }
    return TransformerConfig(**{**base, **kw})


def _module(recipe="bf16", mask_type=AttnMaskType.causal, config=None, **kw) -> FP4CoreAttention:
    return FP4CoreAttention(
        config=config or _config(),
        layer_number=1,
        attn_mask_type=mask_type,
        attention_type="self",
        cp_comm_type=None,
        softmax_scale=None,
        pg_collection=None,
        attention=AttentionConfig(recipe=recipe, **{"backend": "reference", **kw}),
    )


def _qkv(sq=48, sk=48, b=2, dtype=torch.bfloat16, seed=0):
    """Non-contiguous megatron-style views: q/k/v split out of one fused [s, b, ng, (np/ng + 2) hn] tensor."""
    g = torch.Generator().manual_seed(seed)
    per_group = NP // NG + 2
    mixed = torch.randn(sq, b, NG, per_group * HN, generator=g).to(dtype)
    q = mixed[..., : (NP // NG) * HN].reshape(sq, b, NP, HN)
    k = mixed[..., (NP // NG) * HN : (NP // NG + 1) * HN]
    v = mixed[..., (NP // NG + 1) * HN :]
    assert not k.is_contiguous() and not v.is_contiguous()
    return q, k, v


def _to_bshd(t):
    return t.transpose(0, 1).contiguous().bfloat16()


def _expected(q, k, v, recipe, causal):
    out = fa.attention(_to_bshd(q), _to_bshd(k), _to_bshd(v), recipe=recipe, causal=causal, layout="bshd")
    return out.transpose(0, 1).reshape(q.shape[0], q.shape[1], -1)


@pytest.mark.parametrize("recipe", fa.TRAINING_RECIPES)
def test_contract_shapes_and_values(recipe):
    q, k, v = _qkv()
    out = _module(recipe)(
        q, k, v, None, attn_mask_type=AttnMaskType.causal, attention_bias=None, packed_seq_params=None
    )
    assert out.shape == (48, 2, NP * HN) and out.dtype == torch.bfloat16
    assert torch.equal(out, _expected(q, k, v, recipe, causal=True))


def test_mask_type_sets_causality_and_explicit_causal_mask_is_accepted():
    q, k, v = _qkv()
    mod = _module()
    causal = mod(
        q, k, v, None, attn_mask_type=AttnMaskType.causal, attention_bias=None, packed_seq_params=None
    )
    with_mask = mod(
        q,
        k,
        v,
        causal_mask(48, "cpu"),
        attn_mask_type=AttnMaskType.causal,
        attention_bias=None,
        packed_seq_params=None,
    )
    full = mod(
        q, k, v, None, attn_mask_type=AttnMaskType.no_mask, attention_bias=None, packed_seq_params=None
    )
    assert torch.equal(causal, with_mask)
    assert torch.equal(full, _expected(q, k, v, "bf16", causal=False))
    assert not torch.equal(causal, full)
    # attn_mask_type=None falls back to the module's construction-time mask type.
    assert torch.equal(
        mod(q, k, v, None, attn_mask_type=None, attention_bias=None, packed_seq_params=None), causal
    )


def test_fp32_inputs_are_cast_to_bf16_and_back_with_gradients():
    q, k, v = (t.float().requires_grad_() for t in (t.detach().clone() for t in _qkv()))
    out = _module("fp8")(
        q, k, v, None, attn_mask_type=AttnMaskType.causal, attention_bias=None, packed_seq_params=None
    )
    assert out.dtype == torch.float32
    torch.testing.assert_close(
        out, _expected(q.detach(), k.detach(), v.detach(), "fp8", True).float(), rtol=0, atol=0
    )
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and t.grad.dtype == torch.float32 and torch.isfinite(t.grad).all()
        assert t.grad.abs().sum() > 0


def test_tensor_parallel_rank_sees_its_heads_only():
    # Under TP each rank gets np/tp query heads and ng/tp groups; the result must be that rank's slice.
    q, k, v = _qkv()
    full = _module()(
        q, k, v, None, attn_mask_type=AttnMaskType.causal, attention_bias=None, packed_seq_params=None
    )
    tp = 2
    for rank in range(tp):
        qs = q[:, :, rank * NP // tp : (rank + 1) * NP // tp]
        ks, vs = (t[:, :, rank * NG // tp : (rank + 1) * NG // tp] for t in (k, v))
        part = _module()(
            qs, ks, vs, None, attn_mask_type=AttnMaskType.causal, attention_bias=None, packed_seq_params=None
        )
        assert torch.equal(part, full[..., rank * NP // tp * HN : (rank + 1) * NP // tp * HN])


def test_arbitrary_mask_raises():
    q, k, v = _qkv()
    mask = causal_mask(48, "cpu").clone()
    mask[..., 5, 2] = True  # a padding/document mask is not the causal mask
    with pytest.raises(ValueError, match="arbitrary masks"):
        _module()(
            q, k, v, mask, attn_mask_type=AttnMaskType.causal, attention_bias=None, packed_seq_params=None
        )
    with pytest.raises(ValueError, match="boolean"):
        _module()(
            q,
            k,
            v,
            mask.float(),
            attn_mask_type=AttnMaskType.causal,
            attention_bias=None,
            packed_seq_params=None,
        )
    with pytest.raises(NotImplementedError, match="attn_mask_type"):
        _module()(
            q, k, v, None, attn_mask_type=AttnMaskType.arbitrary, attention_bias=None, packed_seq_params=None
        )


def test_unsupported_features_raise_with_the_alternative():
    q, k, v = _qkv()
    packed = PackedSeqParams(qkv_format="thd")
    with pytest.raises(NotImplementedError, match="packed sequences.*whole sequences"):
        _module()(
            q, k, v, None, attn_mask_type=AttnMaskType.causal, attention_bias=None, packed_seq_params=packed
        )
    with pytest.raises(NotImplementedError, match="attention_bias"):
        _module()(
            q,
            k,
            v,
            None,
            attn_mask_type=AttnMaskType.causal,
            attention_bias=torch.zeros(1),
            packed_seq_params=None,
        )
    with pytest.raises(NotImplementedError, match="context_parallel_size=1"):
        _module(config=_config(context_parallel_size=2))
    with pytest.raises(ValueError, match="attention_dropout=0.0"):
        _module(config=_config(attention_dropout=0.1))
    with pytest.raises(ValueError, match="unknown attention backend"):
        _module(backend="nope")
    with pytest.raises(ValueError, match="unknown attention recipe"):
        AttentionConfig(recipe="nope")


def test_forward_only_recipe_runs_without_grad_and_refuses_training():
    q, k, v = _qkv()
    mod = _module("nvfp4qk_mxfp4pv_fast")
    with torch.no_grad():
        out = mod(
            q, k, v, None, attn_mask_type=AttnMaskType.causal, attention_bias=None, packed_seq_params=None
        )
    assert out.shape == (48, 2, NP * HN) and torch.isfinite(out).all()
    with pytest.raises(RuntimeError, match="forward-only"):
        mod(
            q.requires_grad_(),
            k,
            v,
            None,
            attn_mask_type=AttnMaskType.causal,
            attention_bias=None,
            packed_seq_params=None,
        )


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4qk_fp8pv"])
def test_config_qk_rotation_reaches_the_attention(recipe):
    """attention.qk_rotation / qk_rotation_seed of the config run in the core attention (forward
    and backward), as fa.attention with the same rotation does, and not as the unrotated recipe."""
    q, k, v = (t.detach().clone().requires_grad_() for t in _qkv())
    mod = _module(recipe, qk_rotation="hadamard", qk_rotation_seed=4)
    assert f"recipe={recipe}+hadamard(seed 4)" in repr(mod)
    out = mod(q, k, v, None, attn_mask_type=AttnMaskType.causal, attention_bias=None, packed_seq_params=None)
    want = fa.attention(
        *(_to_bshd(t.detach()) for t in (q, k, v)),
        recipe=recipe,
        causal=True,
        layout="bshd",
        qk_rotation="hadamard",
        qk_rotation_seed=4,
    )
    assert torch.equal(out, want.transpose(0, 1).reshape(48, 2, -1))
    assert not torch.equal(out, _expected(q.detach(), k.detach(), v.detach(), recipe, causal=True))
    out.float().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
