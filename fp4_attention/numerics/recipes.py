"""The attention recipes (contract §2) and their registry.

A recipe fixes the number formats of the two products of attention:

| recipe                   | Q/K                       | P                   | V                   | trains |
|--------------------------|---------------------------|---------------------|---------------------|--------|
| `bf16`                   | BF16                      | FP32 -> BF16        | BF16                | yes    |
| `fp8`                    | E4M3, FP32 per-token scale| E4M3, lifted 2^8    | E4M3, 2^k/channel   | yes    |
| `nvfp4qk_fp8pv`          | NVFP4, FP32 per-head scale| E4M3, lifted 2^8    | E4M3, 2^k/channel   | yes    |
| `nvfp4qk_mxfp4pv_fast`   | NVFP4                     | MXFP4, Direct-P     | MXFP4 (alpha q / 6) | no     |
| `nvfp4qk_mxfp4pv_accurate`| NVFP4                     | MXFP4, Direct-P+exp | MXFP4 (alpha q / 6) | no     |

The Direct-P recipes are forward-only: every MXFP4 P/V training run of the paper diverged
(seed §7.6, contract §2).

Option: ``qk_rotation`` (``rotation.py``), a random-sign Hadamard rotation of the head dim of Q
and K before their quantization, for the training recipes with quantized Q/K (``fp8``,
``nvfp4qk_fp8pv``): :func:`with_qk_rotation` returns the recipe with it. Off by default.

Option: ``k_scale_keys`` (``fp8`` only), one E4M3 scale per 64 consecutive keys of K instead of one
per key (``quant.quantize_fp8_key_groups``): the candidate K recipe of the forward issue's K-scale
decision, which lets the CuTe forward fold K's scale into its per-row factor (``k_group``).
:func:`with_k_scale_keys` returns the recipe with it; label ``fp8+k64``. Off by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .rotation import QK_ROTATIONS, QKRotation

__all__ = [
    "E4M3_MAX_LOG2",
    "P_LIFT_LOG2",
    "RECIPES",
    "ROTATION_RECIPES",
    "TRAINING_RECIPES",
    "DirectP",
    "QKRotation",
    "Recipe",
    "check_saturation_invariant",
    "get_recipe",
    "K_SCALE_KEYS",
    "with_k_scale_keys",
    "with_qk_rotation",
]

P_LIFT_LOG2 = 8  # P is lifted by 2^8 = 256 into E4M3's range (FA3/FA4 do the same; contract §2)
E4M3_MAX_LOG2 = math.log2(448.0)  # ~8.807
K_SCALE_KEYS = (1, 64)  # keys per K scale: per token (the fp8 definition), or per 64 keys (option)


def check_saturation_invariant(lift_log2: float, rescale_threshold_log2: float) -> None:
    """Assert the contract's saturation invariant: lift + lazy-rescale threshold <= log2(448).

    With lazy rescaling the running max may lag the true max by up to the threshold, so the
    lifted P can reach 2^(lift + threshold); above 448 E4M3 saturates while the denominator keeps
    the unsaturated value (public FA4 issues 2577 and 2716; contract §4 case 9).

    Raises:
        ValueError: if the invariant does not hold, or the threshold is negative.
    """
    if rescale_threshold_log2 < 0:
        raise ValueError(f"rescale threshold must be >= 0 (log2 units), got {rescale_threshold_log2}")
    if lift_log2 + rescale_threshold_log2 > E4M3_MAX_LOG2:
        raise ValueError(
            f"P lift 2^{lift_log2} with lazy-rescale threshold {rescale_threshold_log2} (log2) lets P reach "
            f"2^{lift_log2 + rescale_threshold_log2:.3f} > 448, where E4M3 saturates; keep lift + threshold "
            "<= "
            f"log2(448) = {E4M3_MAX_LOG2:.3f} (threshold <= {E4M3_MAX_LOG2 - lift_log2:.3f})"
        )


@dataclass(frozen=True)
class DirectP:
    """Direct-P classifier u = max(0, A x + B), q = E2M1(u) (seed §4.2, eq. 17).

    Attributes:
        a, b: classifier coefficients (fast fit A=1.50, B=1.20; a published alternative 1.60/0.95).
        exact_every: 0 = every element uses the classifier; k > 0 = key positions with index % k == 0
            use the true exponential E2M1(2^x) instead. The paper's `accurate` sends about a quarter
            of the elements through the exponential; it does not publish which, so we fix every
            fourth key (a fixed pattern a kernel can assign to the hardware exp2 lanes).
    """

    a: float = 1.50
    b: float = 1.20
    exact_every: int = 0


@dataclass(frozen=True)
class Recipe:
    """Formats of one attention recipe.

    Attributes:
        name: registry name.
        qk: "bf16" | "fp8" (E4M3 per-token scale) | "nvfp4" (per-16 E4M3 + per-head FP32).
        pv: "bf16" | "fp8" (E4M3 P lifted by 2^p_lift_log2, E4M3 V per channel) | "mxfp4".
        p_lift_log2: 8 for FP8 P, 0 otherwise.
        direct_p: the classifier for MXFP4 P, else None.
        trainable: whether a backward exists.
        qk_rotation: the rotation of Q/K's head dim before quantization (``rotation.py``), or None
            (the registered recipes; :func:`with_qk_rotation` sets it).
        k_scale_keys: keys per K scale, 1 (per token: the registered recipes) or 64 (``fp8`` only,
            K quantized per 64 keys counted from key 0; :func:`with_k_scale_keys` sets it).
    """

    name: str
    qk: str
    pv: str
    p_lift_log2: int
    direct_p: DirectP | None
    trainable: bool
    summary: str
    qk_rotation: QKRotation | None = None
    k_scale_keys: int = 1

    def __post_init__(self):
        if self.k_scale_keys not in K_SCALE_KEYS or (self.k_scale_keys != 1 and self.qk != "fp8"):
            raise ValueError(
                f"recipe {self.name}: k_scale_keys must be one of {K_SCALE_KEYS}, and other than 1 only "
                f"with E4M3 Q/K (the fp8 recipe); got {self.k_scale_keys}"
            )
        if self.qk_rotation is not None and not self.takes_qk_rotation:
            raise ValueError(
                f"recipe {self.name}: a Q/K rotation needs quantized Q/K and a backward (the recipes "
                "fp8 and nvfp4qk_fp8pv)"
            )

    @property
    def takes_qk_rotation(self) -> bool:
        """Whether a Q/K rotation applies: quantized Q/K (a rotation only changes what a quantizer
        sees) and a backward (the forward-only Direct-P recipes are out of scope)."""
        return self.trainable and self.qk != "bf16"

    @property
    def label(self) -> str:
        """The name, with ``+k64`` for K scales per 64 keys and ``+hadamard(seed N)`` when a rotation
        is set (for tables and logs)."""
        label = self.name if self.k_scale_keys == 1 else f"{self.name}+k{self.k_scale_keys}"
        return label if self.qk_rotation is None else f"{label}+{self.qk_rotation.label}"


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("bf16", "bf16", "bf16", 0, None, True, "BF16 Q/K/V, FP32 softmax (control arm)"),
        Recipe(
            "fp8",
            "fp8",
            "fp8",
            P_LIFT_LOG2,
            None,
            True,
            "E4M3 Q/K per-token scales, E4M3 P (x256) and V per-channel scales (Hopper-native)",
        ),
        Recipe(
            "nvfp4qk_fp8pv",
            "nvfp4",
            "fp8",
            P_LIFT_LOG2,
            None,
            True,
            "NVFP4 Q/K (exact emulation on Hopper), E4M3 P (x256) and V (the paper's training route)",
        ),
        Recipe(
            "nvfp4qk_mxfp4pv_fast",
            "nvfp4",
            "mxfp4",
            0,
            DirectP(1.50, 1.20, 0),
            False,
            "NVFP4 Q/K, Direct-P MXFP4 P (A=1.50, B=1.20), MXFP4 V; forward only",
        ),
        Recipe(
            "nvfp4qk_mxfp4pv_accurate",
            "nvfp4",
            "mxfp4",
            0,
            DirectP(1.50, 1.20, 4),
            False,
            "as _fast, with every 4th key through the true exponential; forward only",
        ),
    )
}
TRAINING_RECIPES = tuple(name for name, r in RECIPES.items() if r.trainable)
ROTATION_RECIPES = tuple(name for name, r in RECIPES.items() if r.takes_qk_rotation)


def get_recipe(name: str | Recipe) -> Recipe:
    """Look up a recipe by name.

    Raises:
        ValueError: unknown name (the message lists the known recipes).
    """
    if isinstance(name, Recipe):
        return name
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown attention recipe {name!r}; known recipes: {', '.join(RECIPES)}") from None


def with_qk_rotation(recipe: str | Recipe, kind: str, seed: int = 0) -> Recipe:
    """``recipe`` with the Q/K rotation ``kind`` (``"none"`` or ``"hadamard"``) and sign ``seed``.

    Args:
        recipe: a name or a :class:`Recipe`; a rotation it already has is replaced.
        kind: one of ``rotation.QK_ROTATIONS``; ``"none"`` removes the rotation (``seed`` must be 0).
        seed: the sign vector's seed, an integer in [0, 2^63).
    Raises:
        ValueError: unknown recipe or kind, a bad seed, a seed without a rotation, or a recipe that
            takes no rotation (only ``ROTATION_RECIPES`` do).
    """
    rec = get_recipe(recipe)
    if kind not in QK_ROTATIONS:
        raise ValueError(f"qk_rotation={kind!r} is unknown; choose one of {', '.join(QK_ROTATIONS)}")
    if kind == "none":
        if seed != 0:
            raise ValueError(
                f"qk_rotation_seed={seed!r} has no effect with qk_rotation='none'; set qk_rotation="
                "'hadamard' or leave the seed at 0"
            )
        return replace(rec, qk_rotation=None)
    if rec.name not in ROTATION_RECIPES:
        raise ValueError(
            f"qk_rotation={kind!r} applies to the training recipes with quantized Q/K "
            f"({', '.join(ROTATION_RECIPES)}), not {rec.name!r}; use qk_rotation='none' with {rec.name}"
        )
    return replace(rec, qk_rotation=QKRotation(kind, seed))


def with_k_scale_keys(recipe: str | Recipe, keys: int) -> Recipe:
    """``recipe`` with one K scale per ``keys`` consecutive keys (the ``k_scale_keys`` option).

    Args:
        recipe: a name or a :class:`Recipe` (its rotation, if any, is kept).
        keys: 1 (per token, the registered definition) or 64 (``fp8`` only).
    Raises:
        ValueError: unknown recipe, ``keys`` not in ``K_SCALE_KEYS``, or 64 with a recipe whose Q/K
            are not E4M3.
    """
    return replace(get_recipe(recipe), k_scale_keys=keys)
