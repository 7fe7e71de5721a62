"""fp4_attention: FlashAttention with NVFP4 Q/K and FP8 (or MXFP4 Direct-P) P/V.

Usable on its own::

    import fp4_attention as fa
    out = fa.attention(q, k, v, recipe="nvfp4qk_fp8pv", causal=True)        # [B, S, H, D] BF16
    layer = fa.FP4Attention("fp8", causal=True, layout="sbhd")

Recipes (``fa.RECIPES``) and backends (``fa.available_backends()``) are registries. The numerics of
every recipe are defined by the torch reference (``fp4_attention.reference``), which every GPU
backend is tested against; the formats by ``fp4_attention.formats`` and ``fp4_attention.quant``.
See ``shared/spec/precision-contract.md`` for the contract these modules implement.
"""

from .backends import UnsupportedError, available_backends, get_backend, register_backend
from .interface import LAYOUTS, FP4Attention, attention
from .recipes import RECIPES, TRAINING_RECIPES, DirectP, Recipe, get_recipe

__all__ = [
    "LAYOUTS",
    "RECIPES",
    "TRAINING_RECIPES",
    "DirectP",
    "FP4Attention",
    "Recipe",
    "UnsupportedError",
    "attention",
    "available_backends",
    "get_backend",
    "get_recipe",
    "register_backend",
]
