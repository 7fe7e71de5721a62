"""Shared by the CPU and GPU dominant-key tests: float64 gradients on a recipe's own quantized
operands, and the bound every training recipe's gradients must meet where one key holds a row's mass.

Inputs are ``tools/fidelity.py``'s ``gap=X`` family: key 0's logit stands X above the others'
(N(0, 1)) for every query. The bound, for dQ and dK (dV does not involve D):

    |g - g*| <= max(ALPHA * |g*|, BETA * |g_bf16 - g*_bf16|)

with g* the float64 gradient of attention on the recipe's dequantized Q/K/V (the reference
quantizers; straight-through to the inputs), so that the forward's quantization error is not
counted, and the ``bf16`` recipe's error on the same inputs as the second yardstick. Measured on
the reference backend (CPU, S 256/384, Hq/Hkv 4/4 and 6/1, causal and not, gaps 5-40): |g - g*| /
|g*| is 0.05-0.06 for ``fp8`` and ``nvfp4qk_fp8pv`` at gaps 5-8 (the FP8 backward's own rounding:
E4M3 P, E5M2 dO, BF16 dS) and at most 0.15 at gap 10; from gap 12 on the exact gradient is so
small that the BF16 output's rounding in D dominates every recipe, ``bf16`` included, and the
error is 0.75-1.25x the ``bf16`` recipe's for ``fp8`` and 0.75-2.1x for ``nvfp4qk_fp8pv``. Before V's
scale was a power of two, the error at gaps 15-40 was 20-20,000x the ``bf16`` recipe's (dQ norm ~2
where the exact one is 1e-8 to 1e-3).
"""

from __future__ import annotations

import torch

from fp4_attention.numerics.exact import naive_attention
from fp4_attention.numerics.operands import quantize_qk, quantize_v
from fp4_attention.numerics.recipes import get_recipe
from tools.fidelity import make_inputs

ALPHA = 0.2
BETA = 3.0


def dominant_inputs(gap: float, b: int, hq: int, hkv: int, s: int, d: int, seed: int = 7):
    """BF16 ``q [B, Hq, S, D]``, ``k, v [B, Hkv, S, D]`` of the ``gap=X`` family and a BF16 dO."""
    q, k, v = make_inputs(f"gap={gap}", b, hq, hkv, s, d, seed)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).bfloat16()
    return q, k, v, dout


def dequantized_operands(q, k, v, recipe: str, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """float64 ``(q^, k^, v^)`` on ``device``: ``recipe``'s Q/K/V through the reference quantizers
    (on the CPU copies; the GPU quantizers' bytes equal theirs) and dequantized."""
    rec = get_recipe(recipe)
    q_s, k_s = quantize_qk(q.cpu(), k.cpu(), rec)
    return tuple(
        (t.float() if isinstance(t, torch.Tensor) else t.dequantize()).detach().to(device, torch.float64)
        for t in (q_s, k_s, quantize_v(v.cpu(), rec))
    )


def exact_grads(ops: tuple[torch.Tensor, ...], dout, causal: bool) -> tuple[torch.Tensor, ...]:
    """float64 CPU (dQ, dK, dV, LSE) of attention on the :func:`dequantized_operands` ``ops``
    (float64 arithmetic on their device)."""
    ops = [t.detach().clone().requires_grad_() for t in ops]
    out, lse = naive_attention(*ops, causal=causal, softmax_scale=ops[0].shape[-1] ** -0.5)
    out.backward(dout.to(ops[0].device, torch.float64))
    return tuple(t.grad.cpu() for t in ops) + (lse.detach().cpu(),)


def bound_violations(
    grads: dict[str, tuple], exact: dict[str, tuple], slack: dict | None = None
) -> list[str]:
    """Check every recipe of ``grads`` (name -> (dQ, dK, dV) on the CPU) against the bound of the
    module docstring; ``grads`` and ``exact`` must hold ``bf16``. ``slack``: name -> (dQ, dK) norms
    added to the bound (a GPU backend's FP8 dP accumulation, tests/backends/test_dominant_key_gpu.py).
    Returns the violations, worded."""
    bad = []
    for name, got in grads.items():
        if name == "bf16":
            continue
        for i, gname in ((0, "dQ"), (1, "dK")):
            err = float((got[i].double() - exact[name][i]).norm())
            ref = float(exact[name][i].norm())
            err_bf16 = float((grads["bf16"][i].double() - exact["bf16"][i]).norm())
            limit = max(ALPHA * ref, BETA * err_bf16) + (slack or {}).get(name, (0.0, 0.0))[i]
            if not err <= limit:
                bad.append(
                    f"{name} {gname}: error {err:.3e} > {limit:.3e} "
                    f"(|exact| {ref:.3e}, bf16 error {err_bf16:.3e})"
                )
    return bad
