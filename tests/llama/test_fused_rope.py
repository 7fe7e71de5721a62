"""``attention.fuse_rope``: megatron-core's SelfAttention hands RoPE to our core attention
(``fp4_attention.megatron.FP4SelfAttention``). The tiny Llama with it gives bit for bit the loss and
gradients of the same model whose megatron-core RoPE is replaced by our RoPE definition (so the
plumbing, not the rounding, is what is compared), also with layers without RoPE
(``no_rope_freq``) and under selective recomputation of the core attention; the tables are built
once per freqs tensor; what cannot run is refused on construction."""

from __future__ import annotations

import contextlib

import pytest
import torch
from megatron.core.tensor_parallel import random as mcore_random
from megatron.core.transformer import attention as mcore_attention

import llama.builder
from fp4_attention import AttentionConfig
from fp4_attention.megatron import FP4CoreAttention, FP4SelfAttention, rope_tables_of
from fp4_attention.numerics.rope import apply_rope, rope_tables
from llama import build_gpt_model, layer_spec, preset

from .conftest import tokens


def _our_rope_in_megatron(t, freqs, config=None, cu_seqlens=None, mscale=1.0, cp_group=None, **_):
    """megatron-core's ``apply_rotary_pos_emb`` replaced by ``numerics.rope`` (t ``[s, b, h, d]``)."""
    d = t.shape[-1]
    cos, sin = rope_tables(freqs[:, 0, 0, : d // 2])
    return apply_rope(t.permute(1, 2, 0, 3), cos, sin).permute(2, 0, 1, 3)


def _loss_and_grads(model, cfg):
    ids, pos, labels = tokens(2, 64, cfg.vocab_size)
    loss = model(input_ids=ids, position_ids=pos, attention_mask=None, labels=labels).float().mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _with_transformer_config(monkeypatch, **fields):
    """Build models whose megatron-core TransformerConfig has ``fields`` set (after its checks)."""
    make = llama.builder.transformer_config

    def patched(*args, **kwargs):
        tc = make(*args, **kwargs)
        for name, value in fields.items():
            setattr(tc, name, value)
        return tc

    monkeypatch.setattr(llama.builder, "transformer_config", patched)


def _pair(recipe, backend="reference"):
    torch.manual_seed(0)
    fused_cfg = preset("tiny", attention=AttentionConfig(recipe=recipe, backend=backend, fuse_rope=True))
    fused = build_gpt_model(fused_cfg)
    layer = fused.decoder.layers[0].self_attention
    assert isinstance(layer, FP4SelfAttention) and layer.core_attention.rope_from_parent
    plain_cfg = preset("tiny", attention=AttentionConfig(recipe=recipe, backend=backend))
    plain = build_gpt_model(plain_cfg)
    assert type(plain.decoder.layers[0].self_attention) is mcore_attention.SelfAttention
    plain.load_state_dict(fused.state_dict())  # same parameters and keys: nothing new to checkpoint
    return fused, fused_cfg, plain, plain_cfg


_GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize(
    "recipe, backend",
    [
        ("fp8", "reference"),
        ("nvfp4qk_fp8pv", "reference"),
        # the fused RoPE + FP8 quantizer kernel and the Triton RoPE pass in the model on the GPU
        # (the triton backward is deterministic: bit for bit holds there too)
        pytest.param("fp8", "triton", marks=_GPU),
        pytest.param("nvfp4qk_fp8pv", "triton", marks=_GPU),
    ],
)
def test_fused_rope_model_equals_the_model_with_megatrons_rope_replaced(mcore, monkeypatch, recipe, backend):
    fused, fused_cfg, plain, plain_cfg = _pair(recipe, backend)
    layer = fused.decoder.layers[0].self_attention

    loss_f, grads_f = _loss_and_grads(fused, fused_cfg)
    monkeypatch.setattr(mcore_attention, "apply_rotary_pos_emb", _our_rope_in_megatron)
    loss_p, grads_p = _loss_and_grads(plain, plain_cfg)
    assert torch.equal(loss_f, loss_p)
    assert grads_f.keys() == grads_p.keys()
    for name in grads_f:
        assert torch.equal(grads_f[name], grads_p[name]), name
    assert layer.core_attention.rope_slot is None  # cleared after the forward


@pytest.mark.parametrize("case", ["no_rope_freq", "selective recompute"])
def test_layers_without_rope_and_selective_recompute(mcore, monkeypatch, case):
    if case == "no_rope_freq":  # megatron-core's layers without RoPE: every other one here
        n = preset("tiny").num_layers
        _with_transformer_config(monkeypatch, no_rope_freq=[i % 2 for i in range(n)])
    else:  # the core attention recomputed in the backward, after FP4SelfAttention.forward returned
        _with_transformer_config(
            monkeypatch, recompute_granularity="selective", recompute_modules=["core_attn"]
        )
        # megatron-core's checkpoint saves and restores CUDA RNG states: none on a CPU (no dropout here)
        monkeypatch.setattr(mcore_random, "_get_all_rng_states", lambda: ())
        monkeypatch.setattr(mcore_random, "_set_all_rng_states", lambda *states: None)
        monkeypatch.setattr(mcore_random, "_fork_rng", contextlib.nullcontext)
    fused, fused_cfg, plain, plain_cfg = _pair("fp8")
    if case == "selective recompute":
        assert fused.decoder.layers[0].self_attention.checkpoint_core_attention
    loss_f, grads_f = _loss_and_grads(fused, fused_cfg)
    monkeypatch.setattr(mcore_attention, "apply_rotary_pos_emb", _our_rope_in_megatron)
    loss_p, grads_p = _loss_and_grads(plain, plain_cfg)
    assert torch.equal(loss_f, loss_p)
    for name in grads_f:
        assert torch.equal(grads_f[name], grads_p[name]), name


def test_tables_are_built_once_per_freqs_tensor():
    theta = torch.rand(12, 32)
    freqs = torch.cat((theta, theta), -1)[:, None, None, :]
    a = rope_tables_of(freqs, 64)
    assert rope_tables_of(freqs, 64) is a and rope_tables_of((freqs, freqs), 64) is a
    assert torch.equal(a.cos_q, torch.cos(theta)) and a.cos_k is a.cos_q
    freqs.mul_(2)  # modified in place: rebuilt
    b = rope_tables_of(freqs, 64)
    assert b is not a and torch.equal(b.sin_q, torch.sin(2 * theta))
    with pytest.raises(NotImplementedError, match="rotary_percent < 1"):
        rope_tables_of(freqs[..., :32], 128)
    with pytest.raises(ValueError, match=r"\[s, 1, 1, D\] freqs"):
        rope_tables_of(freqs[:, 0], 64)
    with pytest.raises(ValueError, match=r"not cat\(theta, theta\)"):  # e.g. interleaved freqs
        rope_tables_of(torch.rand(12, 1, 1, 64), 64)
    with torch.inference_mode():  # inference tensors: tables for this call only, never cached
        fresh = torch.cat((theta, theta), -1)[:, None, None, :]
        assert rope_tables_of(fresh, 64) is not rope_tables_of(fresh, 64)
        with pytest.raises(ValueError, match=r"not cat\(theta, theta\)"):  # checked there too
            rope_tables_of(torch.rand(12, 1, 1, 64), 64)


def test_what_fused_rope_cannot_run_is_refused(mcore):
    with pytest.raises(NotImplementedError, match="interleaved RoPE"):
        _build_with(rotary_interleaved=True)
    with pytest.raises(NotImplementedError, match="fused_single_qkv_rope"):
        _build_with(fused_single_qkv_rope=True)
    with pytest.raises(ValueError, match="attention.fuse_rope needs our core attention"):
        layer_spec(
            preset("tiny", attention=AttentionConfig(recipe="fp8", backend="reference", fuse_rope=True)),
            core_attention=FP4CoreAttention,
        )
    # the core attention without its parent's tables (a recompute of it alone) is refused
    model = build_gpt_model(
        preset("tiny", attention=AttentionConfig(recipe="fp8", backend="reference", fuse_rope=True))
    )
    core = model.decoder.layers[0].self_attention.core_attention
    assert isinstance(core, FP4CoreAttention)
    q = torch.zeros(8, 1, core.config.num_attention_heads, core.config.kv_channels)
    kv = torch.zeros(8, 1, core.config.num_query_groups, core.config.kv_channels)
    with pytest.raises(RuntimeError, match="without its RoPE tables"):
        core(q, kv, kv, None)
    # fuse_rope under megatron-core's own SelfAttention (a hand-built spec) would not fuse: refused
    core.rope_from_parent = False
    with pytest.raises(RuntimeError, match="needs FP4SelfAttention as its self-attention module"):
        core(q, kv, kv, None)


def _build_with(**config_overrides):
    """FP4SelfAttention built directly on a TransformerConfig with ``config_overrides``."""
    from megatron.core.transformer.spec_utils import build_module

    from llama.builder import transformer_config
    from llama.specs import layer_spec

    cfg = preset("tiny", attention=AttentionConfig(recipe="fp8", backend="reference", fuse_rope=True))
    tc = transformer_config(cfg)
    for k, v in config_overrides.items():
        setattr(tc, k, v)
    attn = layer_spec(cfg).submodules.self_attention
    assert attn.module is FP4SelfAttention
    return build_module(attn, config=tc, layer_number=1)
