"""Shared by the CPU and GPU non-finite tests: where a NaN/Inf in Q, K or V must show in the output.

README and ``numerics/quant.py``: a non-finite input poisons the smallest unit whose scale it
enters, which dequantizes to NaN. For one bad element at (head 1, token 5, channel 3) of Q, K or V
(``[B, H, S, D]``, Hq = Hkv = 2, causal), the NaN reaches:

| tensor | unit (recipe)                                 | output entries NaN                         |
|--------|-----------------------------------------------|--------------------------------------------|
| Q      | NVFP4 per-head group (nvfp4*)                 | head 1                                     |
| Q      | the token (fp8 per-token scale; bf16 itself)  | head 1, row 5                              |
| K      | NVFP4 per-head group                          | head 1 (every row sees key 0)              |
| K      | the token                                     | head 1, rows >= 5 (those that see key 5)   |
| V      | E4M3 per channel (fp8 P/V)                    | head 1, channel 3                          |
| V      | MXFP4 block of 32 tokens (Direct-P)           | head 1, channel 3 (block 0: rows >= 0)     |

Every other output entry equals the clean run's bit for bit. The ``bf16`` recipe quantizes nothing:
IEEE arithmetic decides (a -Inf in Q can give a row whose every score is -Inf, which is an empty row,
O = 0; a NaN in V meets the masked keys' zero probabilities), so for it only no error and head 0
unchanged are checked.
"""

from __future__ import annotations

import torch

from fp4_attention.numerics.recipes import get_recipe

S, D, HEAD, TOKEN, CHANNEL = 64, 64, 1, 5, 3


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, S, D, generator=g).bfloat16() for _ in range(3))


def poisoned_mask(recipe: str, tensor: str) -> torch.Tensor:
    """Bool ``[1, 2, S, D]``: the output entries a bad element of ``tensor`` must turn NaN."""
    rec = get_recipe(recipe)
    if rec.qk == "bf16":
        raise ValueError("bf16 quantizes nothing: no scaling unit to poison")
    mask = torch.zeros(1, 2, S, D, dtype=torch.bool)
    rows = torch.arange(S)
    if tensor == "q":
        if rec.qk == "nvfp4":
            mask[0, HEAD] = True
        else:
            mask[0, HEAD, TOKEN] = True
    elif tensor == "k":
        if rec.qk == "nvfp4":
            mask[0, HEAD] = True
        else:
            mask[0, HEAD, rows >= TOKEN] = True
    elif tensor == "v":
        mask[0, HEAD, :, CHANNEL] = True
    else:
        raise ValueError(tensor)
    return mask


def poison(q, k, v, tensor: str, value: float):
    """Copies of q, k, v with one element of ``tensor`` set to ``value``."""
    q, k, v = (t.clone() for t in (q, k, v))
    dict(q=q, k=k, v=v)[tensor][0, HEAD, TOKEN, CHANNEL] = value
    return q, k, v
