"""Llama-3.1 RoPE frequencies of the built model vs an independent implementation of the formula."""

from __future__ import annotations

import math

import torch

from llama import build_gpt_model, preset


def llama31_inv_freq(
    dim: int,
    theta: float,
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_context: int = 8192,
) -> list[float]:
    """Meta's published Llama-3.1 scaling (llama-models ``apply_scaling``), per frequency, float64."""
    low_freq_wavelen = original_context / low_freq_factor
    high_freq_wavelen = original_context / high_freq_factor
    out = []
    for i in range(0, dim, 2):
        freq = 1.0 / theta ** (i / dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(freq)
        elif wavelen > low_freq_wavelen:
            out.append(freq / factor)
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return out


def test_formula_covers_all_three_bands():
    dim, theta = 128, 500000.0
    base = [1.0 / theta ** (i / dim) for i in range(0, dim, 2)]
    scaled = llama31_inv_freq(dim, theta)
    ratios = [b / s for b, s in zip(base, scaled)]
    assert any(r == 1.0 for r in ratios) and any(abs(r - 8.0) < 1e-12 for r in ratios)
    assert any(1.0 < r < 8.0 - 1e-9 for r in ratios)


def test_model_rope_matches_independent_formula(mcore):
    # The 8B preset's RoPE settings (theta 500000, head dim 128, factor 8) on a tiny model.
    cfg = preset("tiny", head_dim=128)
    model = build_gpt_model(cfg)
    expected = torch.tensor(llama31_inv_freq(128, cfg.rope_theta), dtype=torch.float64)
    got = model.rotary_pos_emb.inv_freq.double().cpu()
    # megatron-core computes theta ** (i / dim) in FP32: relative error ~1e-7.
    torch.testing.assert_close(got, expected, rtol=2e-6, atol=0)
    # ...and the embedding the attention layers receive uses those frequencies (not-interleaved halves).
    s = 16
    emb = model.rotary_pos_emb(s).double().cpu().reshape(s, -1)
    angles = torch.outer(torch.arange(s, dtype=torch.float64), expected)
    torch.testing.assert_close(emb, torch.cat([angles, angles], dim=-1), rtol=2e-6, atol=1e-6)


def test_rope_scaling_off_gives_plain_rope(mcore):
    cfg = preset("tiny", head_dim=128, rope_scaling=False)
    got = build_gpt_model(cfg).rotary_pos_emb.inv_freq.double().cpu()
    plain = torch.tensor([1.0 / cfg.rope_theta ** (i / 128) for i in range(0, 128, 2)], dtype=torch.float64)
    torch.testing.assert_close(got, plain, rtol=2e-6, atol=0)
