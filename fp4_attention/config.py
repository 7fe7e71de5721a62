"""``AttentionConfig``: which attention runs, as one value carried unchanged from the YAML section
``attention:`` through the model config to the megatron-core adapter and the kernel.

    cfg = AttentionConfig(recipe="nvfp4qk_fp8pv")                 # backend "auto"
    cfg, why = cfg.resolve(torch.device("cuda"))                  # backend named, imported
    out = fa.attention(q, k, v, **cfg.call_kwargs(), causal=True)

Validation happens here once, from the registry's declarations (no kernel is imported): the recipe
exists, the backend exists and runs the recipe, the options are ones that backend takes, the Q/K
rotation is known and applies to the recipe (and the backend implements it). That the head dim is
a power of two, which the rotation needs, is checked where the head dim is known
(``llama.LlamaConfig``, and every call of ``fp4_attention.attention``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .backends import AUTO, alternatives, backend_spec, resolve_backend
from .numerics.recipes import Recipe, with_qk_rotation
from .numerics.rotation import check_rotation_head_dim, signs_text

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
        qk_rotation: ``none`` (default) or ``hadamard``: a random-sign Hadamard rotation of the head
            dim of Q and K before quantization (``fp4_attention.numerics.rotation``), which keeps
            an outlier channel from flushing its NVFP4 block; recipes ``fp8`` and
            ``nvfp4qk_fp8pv``, head dims that are powers of two.
        qk_rotation_seed: the seed of the rotation's sign vector, an integer in [0, 2^63); 0 with
            ``qk_rotation: none``. Saved with the run's config, so a resume uses the same rotation.
        fuse_rope: apply RoPE inside the attention (``attention(..., rope=...)``: in the ``fp8``
            recipe's Q/K quantizer on the triton and cute backends) instead of in megatron-core's
            ``Attention.forward`` (``fp4_attention.megatron.FP4SelfAttention``). RoPE is then
            computed in FP32 and rounded once to BF16 (``numerics/rope.py``), as Transformer
            Engine's fused RoPE computes it; megatron-core's unfused RoPE (no TE) rounds each BF16
            product. Off by default until its speed is measured.

    Raises:
        ValueError: a ``fuse_rope`` that is not a bool, unknown recipe, backend or rotation, a
            backend that does not run the recipe (or its rotation; the alternatives named), options
            with ``auto`` or options the backend does not take, a rotation on a recipe that takes
            none, a bad seed.
    """

    recipe: str = "bf16"
    backend: str = AUTO
    options: Mapping[str, Any] = field(default_factory=dict)
    qk_rotation: str = "none"
    qk_rotation_seed: int = 0
    fuse_rope: bool = False

    def __post_init__(self):
        if not isinstance(self.fuse_rope, bool):
            raise ValueError(f"attention.fuse_rope must be true or false, got {self.fuse_rope!r}")
        try:
            rec = with_qk_rotation(self.recipe, self.qk_rotation, self.qk_rotation_seed)
        except ValueError as err:
            raise ValueError(f"attention: {err}") from None
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
        if rec.qk_rotation is not None and rec.qk_rotation.kind not in spec.qk_rotations:
            others = alternatives(rec, exclude=spec.name)
            raise ValueError(
                f"attention.backend={self.backend!r} does not implement attention.qk_rotation="
                f"{self.qk_rotation!r}; use attention.backend=auto or one of {', '.join(others)}"
            )
        unknown = sorted(set(self.options) - set(spec.options))
        if unknown:
            raise ValueError(
                f"attention.options {unknown} are not options of backend {self.backend!r}; it takes "
                f"{sorted(spec.options) or 'none'}"
            )

    def __hash__(self):
        return hash(
            (
                self.recipe,
                self.backend,
                tuple(sorted(self.options.items())),
                self.qk_rotation,
                self.qk_rotation_seed,
                self.fuse_rope,
            )
        )

    def get_recipe(self) -> Recipe:
        """The :class:`Recipe` this config runs: ``recipe`` with its ``qk_rotation``."""
        return with_qk_rotation(self.recipe, self.qk_rotation, self.qk_rotation_seed)

    def check_head_dim(self, head_dim: int) -> None:
        """Raise ValueError if the rotation cannot run at ``head_dim`` (not a power of two)."""
        if self.qk_rotation != "none":
            try:
                check_rotation_head_dim(head_dim)
            except ValueError:
                raise ValueError(
                    f"attention.qk_rotation={self.qk_rotation!r} needs a head dim that is a power of two "
                    f"(16, 32, 64, 128, 256), got {head_dim}; set model.head_dim to one of them or "
                    "attention.qk_rotation=none"
                ) from None

    def qk_rotation_signs(self, head_dim: int) -> str | None:
        """The rotation's sign vector at ``head_dim`` as ``+``/``-`` text, or None without one."""
        if self.qk_rotation == "none":
            return None
        self.check_head_dim(head_dim)
        return signs_text(self.qk_rotation_seed, head_dim)

    def resolve(
        self, device: torch.device | str, *, training: bool = True, deterministic: bool = False
    ) -> tuple[AttentionConfig, str]:
        """This config with ``auto`` replaced by the backend that runs on ``device`` (imported), and
        the reason in words (``fp4_attention.backends.resolve_backend``; ``deterministic``: the
        run's deterministic mode, which admits only bitwise reproducible backwards).

        Raises:
            UnsupportedError / ValueError: the backend cannot run here (a CUDA ``device`` without a
                CUDA GPU included) or cannot be imported.
        """
        name, why = resolve_backend(
            self.backend, self.get_recipe(), device, training=training, deterministic=deterministic
        )
        return replace(self, backend=name), why

    def call_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`fp4_attention.attention` for this config (the rotation's
        only when there is one)."""
        rotation = {}
        if self.qk_rotation != "none":
            rotation = {"qk_rotation": self.qk_rotation, "qk_rotation_seed": self.qk_rotation_seed}
        return {"recipe": self.recipe, "backend": self.backend, **rotation, **self.options}
