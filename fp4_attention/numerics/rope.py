"""Rotary position embedding (RoPE) of Q and K, as ``attention(..., rope=RoPETables)`` applies it
before quantizing them.

Megatron-core applies RoPE in ``Attention.forward`` and hands the core attention BF16 Q/K, which the
low-precision recipes then read again to quantize. Applied inside the attention instead, the
quantizer kernels rotate the rows they load (``backends/triton/rope.py``), and the roped BF16 Q/K are
never written nor read back (issue 19: the design after ``results/quant_amax_h200``).

Layout (megatron-core's non-interleaved RoPE, the Llama / GPT-NeoX one): channel pair
``(i, i + D/2)`` of the token at position ``s`` is rotated by the angle ``theta[s, i]``::

    y[i]       = x[i] cos(theta[s, i]) - x[i + D/2] sin(theta[s, i])
    y[i + D/2] = x[i + D/2] cos(theta[s, i]) + x[i] sin(theta[s, i])          i < D/2

which is megatron-core's ``t * cos + rotate_half(t) * sin`` for its frequencies
``freqs = cat(theta, theta)`` (``RotaryEmbedding.forward``; ``theta = freqs[..., :D/2]``).

Arithmetic (the definition every kernel reproduces to the bit): ``cos`` and ``sin`` of the FP32 angles
are torch's (:func:`rope_tables`, computed once per call, not in the kernels); the BF16 input is
converted to FP32 (exact); each product is rounded to FP32 and the two are added in FP32 (no fused
multiply-add: the kernels are compiled with FP contraction off); the sum is rounded once to BF16.
So the quantizers see exactly the BF16 tensor that an FP32 RoPE followed by a BF16 cast gives
(Transformer Engine's fused RoPE computes the same sums, with its own in-kernel ``sincos`` and FMAs),
and ``attention(q, k, v, rope=RoPETables.from_angles(t))`` equals ``attention(apply_rope(q, *tables),
apply_rope(k, *tables), v)`` for every recipe and backend, forward and backward.

Backward: ``y = R x`` per pair with ``R`` the rotation by ``theta``, so ``dL/dx = R^T dL/dy``:
``dx[i] = g[i] cos + g[i + D/2] sin``, ``dx[i + D/2] = g[i + D/2] cos - g[i] sin`` in FP32 from the
BF16 ``dL/dy`` the attention's backward returns, rounded once to BF16 (:func:`rope_grad`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RoPETables", "apply_rope", "check_rotary_angles", "rope_grad", "rope_tables"]


def check_rotary_angles(angles: torch.Tensor, seq: int, head_dim: int, who: str = "rotary_angles") -> None:
    """Raise unless ``angles`` is an FP32 ``[seq, head_dim / 2]`` tensor.

    Raises:
        TypeError: not a tensor, or not FP32.
        ValueError: an odd head dim, or another shape (the message gives the expected one).
    """
    if not isinstance(angles, torch.Tensor):
        raise TypeError(f"{who} must be a torch.Tensor, got {type(angles).__name__}")
    if head_dim % 2:
        raise ValueError(
            f"RoPE rotates channel pairs (i, i + D/2): the head dim must be even, got {head_dim}"
        )
    if angles.dtype != torch.float32:
        raise TypeError(
            f"{who} must be FP32 angles (radians), got {angles.dtype}; BF16 angles lose the position "
            "(an angle of 4000 rad has a BF16 spacing of 16 rad)"
        )
    if tuple(angles.shape) != (seq, head_dim // 2):
        raise ValueError(
            f"{who} must be [seq, head_dim / 2] = [{seq}, {head_dim // 2}] (the angle of channel pair "
            f"(i, i + D/2) at each position; megatron-core's freqs [s, 1, 1, D] give it as "
            f"freqs[:, 0, 0, :D // 2]), got {tuple(angles.shape)}"
        )


def rope_tables(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of FP32 ``angles [S, D/2]``: contiguous FP32 ``[S, D/2]`` each (torch's cos and sin,
    the ones every backend reads)."""
    a = angles.float()
    return torch.cos(a).contiguous(), torch.sin(a).contiguous()


@dataclass(frozen=True)
class RoPETables:
    """The ``cos``/``sin`` tables of Q's and K's positions (contiguous FP32 ``[S, D/2]`` each;
    :func:`rope_tables`): what ``attention(..., rope=...)`` takes. Build them once per step and
    pass them to every layer (the cos/sin launches are then paid once, not per layer).

    Attributes:
        cos_q, sin_q: Q's tables ``[Sq, D/2]``.
        cos_k, sin_k: K's tables ``[Sk, D/2]`` (the same tensors as Q's when built from one set of
            angles).
    """

    cos_q: torch.Tensor
    sin_q: torch.Tensor
    cos_k: torch.Tensor
    sin_k: torch.Tensor

    @classmethod
    def from_angles(cls, angles_q: torch.Tensor, angles_k: torch.Tensor | None = None) -> RoPETables:
        """Tables of FP32 angles ``[Sq, D/2]`` (and ``[Sk, D/2]`` for K when its positions differ;
        None: Q's).

        Raises:
            TypeError: angles that are not FP32.
            ValueError: angles that are not 2-D, or Q's and K's of different widths.
        """
        for name, a in (("angles_q", angles_q), ("angles_k", angles_k)):
            if a is None:
                continue
            if not isinstance(a, torch.Tensor) or a.dim() != 2:
                got = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
                raise ValueError(
                    f"{name} must be a 2-D [seq, head_dim / 2] tensor (megatron-core's freqs [s, 1, 1, D] "
                    f"give it as freqs[:, 0, 0, :D // 2]), got {got}"
                )
            check_rotary_angles(a, a.shape[0], 2 * a.shape[1], name)
        if angles_k is not None and angles_k.shape[1] != angles_q.shape[1]:
            raise ValueError(
                f"angles_q and angles_k must cover one head dim, got {2 * angles_q.shape[1]} and "
                f"{2 * angles_k.shape[1]}"
            )
        cq, sq = rope_tables(angles_q)
        ck, sk = (cq, sq) if angles_k is None else rope_tables(angles_k)
        return cls(cos_q=cq, sin_q=sq, cos_k=ck, sin_k=sk)

    def check(self, sq: int, sk: int, head_dim: int, device: torch.device) -> None:
        """Raise unless the tables fit Q ``[.., sq, head_dim]`` and K ``[.., sk, head_dim]`` on ``device``.

        Raises:
            TypeError: a table that is not an FP32 tensor.
            ValueError: an odd head dim, a table of another shape, not contiguous, or on another device.
        """
        if head_dim % 2:
            raise ValueError(
                f"RoPE rotates channel pairs (i, i + D/2): the head dim must be even, got {head_dim}"
            )
        for name, t, s in (
            ("cos_q", self.cos_q, sq),
            ("sin_q", self.sin_q, sq),
            ("cos_k", self.cos_k, sk),
            ("sin_k", self.sin_k, sk),
        ):
            fix = "build the tables with RoPETables.from_angles(theta) on the device of q"
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
                got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
                raise TypeError(f"rope.{name} must be an FP32 table, got {got}; {fix}")
            if tuple(t.shape) != (s, head_dim // 2):
                raise ValueError(
                    f"rope.{name} must be [seq, head_dim / 2] = [{s}, {head_dim // 2}] for this call, got "
                    f"{tuple(t.shape)}; {fix} (theta [S, D/2] of these positions)"
                )
            if not t.is_contiguous() or t.device != device:
                raise ValueError(
                    f"rope.{name} must be contiguous and on {device} (the device of q), got "
                    f"{t.device}{'' if t.is_contiguous() else ', not contiguous'}; {fix}"
                )


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = x.shape[-1] // 2
    xf = x.float()
    return xf[..., :h], xf[..., h:]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of ``x [B, H, S, D]`` (BF16 or FP32, any strides) with tables ``cos, sin [S, D/2]`` (FP32,
    :func:`rope_tables`): the module docstring's formula in FP32, rounded once to BF16.

    Returns:
        contiguous BF16 ``[B, H, S, D]``.
    """
    x1, x2 = _halves(x)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    return torch.cat((y1, y2), dim=-1).bfloat16()


def rope_grad(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``dL/dx`` from ``g = dL/dy [B, H, S, D]`` (BF16 or FP32) of ``y = apply_rope(x)``: the transposed
    rotation in FP32 (module docstring), rounded once to BF16.

    Returns:
        contiguous BF16 ``[B, H, S, D]``.
    """
    g1, g2 = _halves(g)
    d1 = g1 * cos + g2 * sin
    d2 = g2 * cos - g1 * sin
    return torch.cat((d1, d2), dim=-1).bfloat16()
