"""``AttentionConfig``: which attention runs, as one value carried unchanged from the YAML section
``attention:`` through the model config to the megatron-core adapter and the kernel.

    cfg = AttentionConfig(recipe="nvfp4qk_fp8pv")                 # backend "auto"
    cfg, why = cfg.resolve(torch.device("cuda"))                  # backend named, imported
    out = fa.attention(q, k, v, **cfg.call_kwargs(), causal=True)

Validation happens here once, from the registry's declarations (no kernel is imported): the recipe
exists, the backend exists and runs the recipe, the options are ones that backend takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .backends import AUTO, alternatives, backend_spec, resolve_backend
from .numerics.recipes import get_recipe

__all__ = ["AttentionConfig"]


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """The attention of a model: recipe, backend and backend options.

    Attributes:
        recipe: a name from ``fp4_attention.RECIPES`` (training: ``bf16``, ``fp8``, ``nvfp4qk_fp8pv``).
        backend: ``auto`` (the registry picks the highest-priority backend that runs the recipe on
            the device: :meth:`resolve`) or a registered backend name (``fa.available_backends()``).
        options: keyword options of that backend (tiles, block sizes: benchmarks and tests); only
            with a named backend.

    Raises:
        ValueError: unknown recipe or backend, a backend that does not run the recipe (the
            alternatives named), options with ``auto`` or options the backend does not take.
    """

    recipe: str = "bf16"
    backend: str = AUTO
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        rec = get_recipe(self.recipe)
        if not isinstance(self.options, Mapping):
            raise ValueError(f"attention.options must be a mapping of backend options, got {self.options!r}")
        object.__setattr__(self, "options", dict(self.options))
        if self.backend == AUTO:
            if self.options:
                raise ValueError(
                    f"attention.options {sorted(self.options)} need a named attention.backend (they "
                    "are backend-specific); set attention.backend or drop the options"
                )
            return
        spec = backend_spec(self.backend)
        if rec.name not in spec.recipes:
            others = alternatives(rec, exclude=spec.name)
            raise ValueError(
                f"attention.backend={self.backend!r} runs recipe(s) {', '.join(spec.recipes)}, not "
                f"{rec.name!r}; use attention.backend=auto or one of {', '.join(others)}"
            )
        unknown = sorted(set(self.options) - set(spec.options))
        if unknown:
            raise ValueError(
                f"attention.options {unknown} are not options of backend {self.backend!r}; it takes "
                f"{sorted(spec.options) or 'none'}"
            )

    def __hash__(self):
        return hash((self.recipe, self.backend, tuple(sorted(self.options.items()))))

    def resolve(self, device: torch.device | str, *, training: bool = True) -> tuple[AttentionConfig, str]:
        """This config with ``auto`` replaced by the backend that runs on ``device`` (imported), and
        the reason in words (``fp4_attention.backends.resolve_backend``).

        Raises:
            UnsupportedError / ValueError: the backend cannot run here or cannot be imported.
        """
        name, why = resolve_backend(self.backend, self.recipe, device, training=training)
        return replace(self, backend=name), why

    def call_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`fp4_attention.attention` for this config."""
        return {"recipe": self.recipe, "backend": self.backend, **self.options}
