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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "E4M3_MAX_LOG2",
    "P_LIFT_LOG2",
    "RECIPES",
    "TRAINING_RECIPES",
    "DirectP",
    "Recipe",
    "check_saturation_invariant",
    "get_recipe",
]

P_LIFT_LOG2 = 8  # P is lifted by 2^8 = 256 into E4M3's range (FA3/FA4 do the same; contract §2)
E4M3_MAX_LOG2 = math.log2(448.0)  # ~8.807


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
    """

    name: str
    qk: str
    pv: str
    p_lift_log2: int
    direct_p: DirectP | None
    trainable: bool
    summary: str


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
