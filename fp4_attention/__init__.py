"""fp4_attention: FlashAttention with NVFP4 Q/K and FP8 (or MXFP4 Direct-P) P/V.

Usable on its own::

    import fp4_attention as fa
    out = fa.attention(q, k, v, recipe="nvfp4qk_fp8pv", causal=True)        # [B, S, H, D] BF16
    layer = fa.FP4Attention("fp8", causal=True, layout="sbhd")
    rope = fa.RoPETables.from_angles(theta)          # theta FP32 [S, D/2]; once per step
    out = fa.attention(q, k, v, recipe="fp8", causal=True, rope=rope)       # RoPE inside the quantizers

Layout: ``numerics/`` defines every recipe's numbers (formats, quantizers, recipes, operands, the
torch reference, float64 attention, Direct-P); ``backends/`` computes them (the registry, the
``reference``, ``triton``, ``cute`` and ``fa4`` backends, each declaring what it runs);
``config.py`` holds :class:`AttentionConfig` (recipe, backend, options: what the YAML section
``attention:`` carries to the kernel); ``interface.py`` the public function and module;
``megatron.py`` the megatron-core adapter (imports megatron-core; not imported here).

Recipes (``fa.RECIPES``) and backends (``fa.available_backends()``) are registries. The numerics of
every recipe are defined by the torch reference (``fp4_attention.numerics.reference``), which every
GPU backend is tested against.
See ``shared/spec/precision-contract.md`` for the contract these modules implement.
"""

from .backends import (
    BackendSpec,
    UnsupportedError,
    available_backends,
    backend_spec,
    get_backend,
    register_backend,
    resolve_backend,
)
from .config import AttentionConfig
from .interface import LAYOUTS, FP4Attention, attention
from .numerics.recipes import RECIPES, TRAINING_RECIPES, DirectP, Recipe, get_recipe
from .numerics.rope import RoPETables

__all__ = [
    "LAYOUTS",
    "RECIPES",
    "TRAINING_RECIPES",
    "AttentionConfig",
    "BackendSpec",
    "DirectP",
    "FP4Attention",
    "Recipe",
    "RoPETables",
    "UnsupportedError",
    "attention",
    "available_backends",
    "backend_spec",
    "get_backend",
    "get_recipe",
    "register_backend",
    "resolve_backend",
]
