"""Direct-P: MXFP4 probabilities classified straight from scores (seed §4.2-4.4, contract §2).

Design note
-----------
For a query row, work in log2 units ``z = s * log2(e)``. Keys are grouped in MXFP4 blocks of 32
(aligned to absolute key index). For block B:

    e_B = ceil(max_{j in B} z_j)                    block exponent (integer)
    x_j = z_j - e_B + log2(6)                       <= log2 6, so 2^x_j <= 6
    ideal:      q_j = E2M1(2^x_j)                    (the block max lands in (3, 6])
    Direct-P:   q_j = E2M1(max(0, A x_j + B))        (A = 1.50, B = 1.20 for `fast`)

and the represented probability of key j is ``2^e_B * q_j / 6`` (the paper's alpha q / 6 form).

Anchor. The contract writes ``x = (z - m) log2 e - e_B + log2 6`` with a row anchor m. We use the
running row max of the *integer* block exponents as the anchor, i.e. the stored block scale is
``2^(e_B - m)`` with ``e_B - m`` an integer in [-127, 0] (E8M0 range). Because the anchor is an
integer, x, the codes and the relative scales do not depend on it: the result equals the paper's
shiftless path (m = 0) exactly, and does not depend on the KV tile size, while FP32 never overflows
for large logits (the paper needed a separate range guard for logits above ~500 in its shiftless
kernel). When the anchor rises, the running sums are rescaled by an exact power of two. A block
whose exponent falls more than 127 below the anchor has no E8M0 scale and is flushed to zero (its
mass is lost; this needs a logit gap above 88 inside one row).

Represented normalization (seed §4.3, eq. 19-21): the denominator is summed from the same codes
and scales that PV consumes, ``L = sum_B 2^(e_B - m) * ((sum_{j in B} q_j) / 6)``, evaluated as
``alpha * (c / 6)``, never ``(alpha / 6) * c`` (the latter flushed a block to zero at E8M0 code 1 in
the paper's layer-39 failure).
"""

from __future__ import annotations

import math

import torch

from .formats import E2M1_MAX, round_e2m1
from .quant import MXFP4_BLOCK
from .recipes import DirectP

__all__ = ["E8M0_MIN_EXP", "LOG2_6", "block_exponent", "classifier_codes", "ideal_codes", "p_codes"]

LOG2_6 = math.log2(6.0)
E8M0_MIN_EXP = -127


def block_exponent(zmax: torch.Tensor) -> torch.Tensor:
    """``e_B = ceil(zmax)`` for block maxima in log2 units (-inf stays -inf: an empty block)."""
    return torch.ceil(zmax)


def ideal_codes(x: torch.Tensor) -> torch.Tensor:
    """Exact-path E2M1 values ``E2M1(2^x)`` (float32; x may be -inf -> 0)."""
    return round_e2m1(torch.exp2(x.float()).clamp(max=E2M1_MAX))


def classifier_codes(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """Direct-P E2M1 values ``E2M1(max(0, a x + b))`` (eq. 17; saturates at 6)."""
    u = torch.clamp(a * x.float() + b, min=0.0, max=E2M1_MAX)
    return round_e2m1(u)


def p_codes(
    z_blocks: torch.Tensor, cfg: DirectP, key_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and block exponents of one tile of scores.

    Args:
        z_blocks: float32 ``[..., nb, 32]`` scores in log2 units, masked keys = -inf.
        cfg: the Direct-P configuration of the recipe.
        key_index: int64 ``[nb, 32]`` absolute key indices (selects the exact-exp lanes).
    Returns:
        ``(q, e_B)``: q float32 E2M1 values ``[..., nb, 32]``; e_B float32 ``[..., nb]`` (integers,
        -inf for a block with no visible key, NaN for a block holding a NaN score: its codes are
        0 and the NaN exponent poisons the row's anchor, denominator and output, as a NaN in Q/K
        poisons its NVFP4 group in ``quant.py``).
    """
    if z_blocks.shape[-1] != MXFP4_BLOCK:
        raise ValueError(
            f"p_codes: last dim must be the MXFP4 block ({MXFP4_BLOCK}), got {z_blocks.shape[-1]}"
        )
    e_b = block_exponent(z_blocks.amax(-1))  # amax propagates NaN
    empty = torch.isinf(e_b) | torch.isnan(e_b)
    x = z_blocks - torch.where(empty, torch.zeros_like(e_b), e_b).unsqueeze(-1) + LOG2_6
    x = torch.where(empty.unsqueeze(-1), torch.full_like(x, -torch.inf), x)
    q = classifier_codes(x, cfg.a, cfg.b)
    if cfg.exact_every:
        exact_lane = (key_index % cfg.exact_every) == 0
        q = torch.where(exact_lane, ideal_codes(x), q)
    return q, e_b
