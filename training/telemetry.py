"""Attention telemetry: per layer, the largest attention logit and the NVFP4 zero-scale-block fraction.

A forward pre-hook on every ``FP4CoreAttention`` module reads the query and key it is given
(``[s, b, heads, d]``, RoPE applied) on sampled steps only (the trainer arms it for the first
micro-batch of every ``logging.telemetry_interval``-th step); otherwise it returns at once. On a
sampled call, for the first sequence of the micro-batch and its first ``MAX_TOKENS`` positions:

* ``max_logit``: ``max |q_i . k_j| * softmax_scale`` over causal pairs ``j <= i`` (GQA heads mapped
  as in the attention), in FP32 from the BF16 inputs - what the softmax sees before quantization;
* ``zero_scale_block_frac``: for recipes with NVFP4 Q/K, the fraction of 16-element Q and K blocks
  whose E4M3 block-scale code is 0 (the block dequantizes to all zeros), quantized as the recipe
  does (``fp4_attention.numerics.operands.quantize_qk``, per-head global scale); None for other recipes.

Values are this rank's: its tensor-parallel heads and its pipeline stage's layers (the trainer logs
rank 0's). Cost on a sampled step: one ``[heads, T, T]`` product and one quantization per layer.
"""

from __future__ import annotations

import torch

__all__ = ["AttentionTelemetry"]

MAX_TOKENS = 512


class AttentionTelemetry:
    def __init__(self, model: torch.nn.Module):
        from fp4_attention.megatron import FP4CoreAttention

        self.armed = False
        self.results: dict[int, tuple[float, float | None]] = {}
        self._handles = []
        for module in model.modules():
            if isinstance(module, FP4CoreAttention):
                self._handles.append(module.register_forward_pre_hook(self._hook))

    def arm(self) -> None:
        self.results = {}
        self.armed = True

    def collect(self) -> dict[int, tuple[float, float | None]]:
        self.armed = False
        out, self.results = self.results, {}
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _hook(self, module, args) -> None:
        if not self.armed or module.layer_number in self.results:
            return
        query, key = args[0], args[1]
        with torch.no_grad():
            self.results[module.layer_number] = measure(query, key, module)


def measure(query: torch.Tensor, key: torch.Tensor, module) -> tuple[float, float | None]:
    """(max_logit, zero_scale_block_frac) of ``query [s, b, hq, d]`` / ``key [s, b, hkv, d]``."""
    from fp4_attention.numerics.operands import quantize_qk

    t = min(query.shape[0], MAX_TOKENS)
    q = query[:t, 0].transpose(0, 1).to(torch.bfloat16)  # [hq, t, d]
    k = key[:t, 0].transpose(0, 1).to(torch.bfloat16)  # [hkv, t, d]
    d = q.shape[-1]
    scale = module.softmax_scale if module.softmax_scale is not None else d**-0.5
    kk = k.float().repeat_interleave(q.shape[0] // k.shape[0], dim=0)
    logits = torch.matmul(q.float(), kk.transpose(-1, -2)).abs() * scale
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    max_logit = float(logits.masked_fill(~causal, 0.0).amax())
    zero_frac = None
    if module.recipe.qk == "nvfp4":
        qn, kn = quantize_qk(q.unsqueeze(0), k.unsqueeze(0), module.recipe)
        zeros = int((qn.block_scale == 0).sum()) + int((kn.block_scale == 0).sum())
        zero_frac = zeros / (qn.block_scale.numel() + kn.block_scale.numel())
    return max_logit, zero_frac
