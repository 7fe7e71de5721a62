"""The Q/K rotation: a random-sign Hadamard transform of the head dim, applied before quantization.

For a head dim D (a power of two), a sign vector ``s`` in {+1, -1}^D and the Sylvester Hadamard
matrix ``Had`` (entries +-1, ``Had = Had^T``, ``Had Had = D I``)::

    H = diag(s) Had / sqrt(D)                 orthogonal: H H^T = I
    rotate(x)   = x H   = FWHT(x * s) * D^-1/2              (x a row vector [..., D])
    unrotate(g) = g H^T = (FWHT(g) * D^-1/2) * s

Scores are invariant, ``(q H)(k H)^T = q k^T``; what changes is what the quantizer sees: one
channel's outlier is spread over all D channels before the 16-element NVFP4 blocks (or the per-token
E4M3 scale) are formed, so it no longer flushes the other entries of its block to zero.
Transformer Engine's NVFP4 recipe applies random Hadamard transforms to its GEMM inputs for the
same reason. The backward receives dL/d(x H) from the products on rotated operands and returns
``dL/dx = dL/d(x H) H^T = unrotate(...)``.

Arithmetic (the definition every kernel reproduces to the bit): the input (BF16) is converted to
FP32 (exact), multiplied by the signs (exact), transformed by the fast Walsh-Hadamard butterfly in
the fixed stage order h = 1, 2, 4, ..., D/2, each stage replacing the pairs (i, i + h) of every
block of 2h elements by (a + b, a - b) in FP32, then multiplied once by the FP32 constant
``fp32(D^-1/2)`` (a power of two, hence exact, for D = 16, 64, 256). Additions in a fixed order are
deterministic, so a kernel doing the same stages gets the same FP32 bits (a matmul by H would not:
its summation order is the library's). The quantizers take FP32 input (``quant.quantize_nvfp4``,
``quant.quantize_fp8`` and the Triton quantizers convert to FP32 first), so the FP32 rotated value
is quantized as it is: no rounding to BF16 in between, which would add a BF16 rounding error
(2^-9 relative) that the unrotated recipe does not have.

Signs: ``s_i = 1 - 2 b_i`` with ``b = torch.randint(0, 2, (D,))`` from a CPU ``torch.Generator``
seeded with the seed, the same vector for Q and K (and for every layer and head). A training run
stores the seed in its config and the sign string in the resolved config (``training.resolved``),
so a resume uses, or refuses to run without, the same H.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

__all__ = [
    "QK_ROTATIONS",
    "SEED_LIMIT",
    "QKRotation",
    "check_rotation_head_dim",
    "fwht",
    "hadamard_signs",
    "inv_sqrt_dim",
    "rotate",
    "signs_text",
    "unrotate",
]

QK_ROTATIONS = ("none", "hadamard")  # "none": no rotation (the default)
SEED_LIMIT = 2**63  # seeds are integers in [0, 2^63)


def check_rotation_head_dim(d: int) -> None:
    """Raise ValueError unless ``d`` is a power of two >= 2 (the butterfly needs one).

    Raises:
        ValueError: naming the head dim and the fix.
    """
    if d < 2 or d & (d - 1):
        raise ValueError(
            f"qk_rotation='hadamard' needs a head dim that is a power of two (16, 32, 64, 128, 256), got "
            f"{d}; use qk_rotation='none' for this head dim"
        )


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"qk_rotation_seed must be an integer in [0, 2^63), got {seed!r}")
    return seed


@functools.lru_cache(maxsize=64)
def _signs_cpu(seed: int, d: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    bits = torch.randint(0, 2, (d,), generator=g, dtype=torch.int64)
    return (1 - 2 * bits).to(torch.float32)


@functools.lru_cache(maxsize=64)
def _signs_on(seed: int, d: int, device: str) -> torch.Tensor:
    return _signs_cpu(seed, d).to(device)  # one host-to-device copy per (seed, d, device)


def hadamard_signs(seed: int, d: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The sign vector of the rotation: FP32 ``[d]`` of +-1.0, a function of ``(seed, d)`` only.

    Derived on the CPU (``torch.Generator`` seeded with ``seed``, ``randint(0, 2)``); on another
    ``device`` a cached copy (do not modify it in place). Raises ValueError for a seed outside
    [0, 2^63) or a head dim that is not a power of two.
    """
    check_rotation_head_dim(d)
    _check_seed(seed)
    if device is None or torch.device(device).type == "cpu":
        return _signs_cpu(seed, d).clone()
    return _signs_on(seed, d, str(torch.device(device)))


def signs_text(seed: int, d: int) -> str:
    """The sign vector as a string of ``+`` and ``-`` (what a run's resolved config records)."""
    return "".join("+" if v > 0 else "-" for v in _signs_cpu(_check_seed(seed), d).tolist())


def inv_sqrt_dim(d: int) -> float:
    """``fp32(d ** -0.5)`` as a Python float (exactly representable in FP32): the normalization."""
    return float(torch.tensor(d**-0.5, dtype=torch.float32))


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized fast Walsh-Hadamard transform of the last dim: ``x @ Had`` (Sylvester order).

    Stages h = 1, 2, 4, ..., D/2 in that order; stage h maps the pair (i, i + h) of each block of
    2h elements to (a + b, a - b), in ``x``'s dtype (FP32 for the recipes, float64 in tests).

    Args:
        x: float tensor ``[..., D]``, D a power of two.
    Returns:
        a new tensor, same shape and dtype.
    """
    d = x.shape[-1]
    check_rotation_head_dim(d)
    lead = x.shape[:-1]
    h = 1
    while h < d:
        y = x.reshape(*lead, d // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(*lead, d)
        h *= 2
    return x


def _norm(d: int, like: torch.Tensor) -> torch.Tensor:
    """The normalization as a 0-d tensor of ``like``'s dtype (FP32: the FP32 constant; float64:
    the exact-ish float64 value, for the definition in tests)."""
    value = inv_sqrt_dim(d) if like.dtype == torch.float32 else d**-0.5
    return torch.tensor(value, dtype=like.dtype, device=like.device)


def rotate(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """``x H = FWHT(x * s) * D^-1/2`` in FP32 (float64 input stays float64).

    Args:
        x: ``[..., D]`` BF16, FP32 or float64 (BF16 is converted to FP32 exactly first).
        signs: ``[D]`` of +-1 (:func:`hadamard_signs`).
    Returns:
        FP32 ``[..., D]`` (float64 for float64 input).
    """
    xf = x if x.dtype == torch.float64 else x.float()
    y = fwht(xf * signs.to(xf.dtype))
    return y * _norm(x.shape[-1], y)


def unrotate(g: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """``g H^T = (FWHT(g) * D^-1/2) * s``: the inverse of :func:`rotate` (and its backward).

    Args:
        g: ``[..., D]`` FP32 (or float64), e.g. dQ in the rotated basis.
        signs: the forward's ``[D]`` signs.
    Returns:
        same dtype as ``g`` (FP32 for BF16 input).
    """
    gf = g if g.dtype == torch.float64 else g.float()
    y = fwht(gf)
    return (y * _norm(g.shape[-1], y)) * signs.to(y.dtype)


@dataclass(frozen=True)
class QKRotation:
    """A rotation of the head dim of Q and K (see the module docstring); part of a :class:`Recipe`.

    Attributes:
        kind: ``"hadamard"`` (the only rotation; "no rotation" is ``Recipe.qk_rotation = None``).
        seed: the sign vector's seed, an integer in [0, 2^63).

    Raises:
        ValueError: unknown kind or a bad seed.
    """

    kind: str = "hadamard"
    seed: int = 0

    def __post_init__(self):
        if self.kind != "hadamard":
            raise ValueError(f"qk_rotation={self.kind!r} is unknown; choose one of {', '.join(QK_ROTATIONS)}")
        _check_seed(self.seed)

    def signs(self, d: int, device: torch.device | str | None = None) -> torch.Tensor:
        """FP32 ``[d]`` sign vector on ``device`` (:func:`hadamard_signs`)."""
        return hadamard_signs(self.seed, d, device)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`rotate` of ``x [..., D]`` with this rotation's signs, FP32."""
        return rotate(x, self.signs(x.shape[-1], x.device))

    def unrotate(self, g: torch.Tensor) -> torch.Tensor:
        """:func:`unrotate` of ``g [..., D]`` with this rotation's signs, FP32."""
        return unrotate(g, self.signs(g.shape[-1], g.device))

    @property
    def label(self) -> str:
        return f"{self.kind}(seed {self.seed})"
