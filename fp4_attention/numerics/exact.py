"""Float64 naive attention: the ground truth the fidelity script and tests compare against.

``softmax(Q K^T * scale) V`` materialized in float64 (Sq x Sk), GQA by repeating K/V heads,
bottom-right causal alignment. Differentiable with torch autograd. Use for small sizes only.
"""

from __future__ import annotations

import torch

__all__ = ["naive_attention"]


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive attention in the dtype of its inputs (pass float64 for ground truth).

    Args:
        q: ``[B, Hq, Sq, D]``; k, v: ``[B, Hkv, Sk, D]`` with Hq % Hkv == 0.
    Returns:
        ``(out [B, Hq, Sq, D], lse [B, Hq, Sq])``; rows with no visible key give 0 and -inf.
    """
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * softmax_scale
    sq, sk = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(sq, device=q.device).unsqueeze(1)
        j = torch.arange(sk, device=q.device).unsqueeze(0)
        vis = j <= i + (sk - sq)
    else:
        vis = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    empty = ~vis.any(-1, keepdim=True)
    s = s.masked_fill(~vis, -torch.inf).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    p = torch.exp(s - lse).masked_fill(empty, 0.0)
    out = torch.matmul(p, v)
    lse = lse.masked_fill(empty, -torch.inf).squeeze(-1)
    return out, lse
