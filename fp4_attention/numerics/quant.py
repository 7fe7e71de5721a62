"""Block-scaled quantizers: NVFP4, MXFP4 (OCP and the paper's P/V convention) and scaled FP8.

These define, to the bit, what every backend's quantizer kernels must produce (contract §1).
All arithmetic is float32 in the order written below, with IEEE round-to-nearest division (the
GPU kernels use ``div_rn``), on top of the exact codecs of ``formats.py``. Note: torch divides a
tensor by a Python scalar as a multiplication by the scalar's reciprocal, which is not IEEE
division and differs in the last bit for some inputs (seen on the H200: E4M3 scales one code apart);
hence :func:`ieee_div`, which divides by a full tensor.

NVFP4 (one FP32 global scale ``g`` per scale group, one E4M3 scale per 16 elements of the last
dim, E2M1 payload packed two per byte, element 2i in the low nibble)::

    g    = amax_group / 2688            (2688 = 448 * 6; amax == 0 -> g = 1)
    s_b  = E4M3( amax_block / 6 / g )   (two float32 divisions, in that order; saturating)
    q    = E2M1( x / (s_b * g) )        (q = 0 where s_b * g == 0)
    x^   = (s_b * q) * g                (s_b * q is exact in BF16: <= 6 significant bits)

MXFP4, OCP MX v1.0 (E8M0 scale per 32 elements)::

    e = clamp(floor(log2 amax_block) - 2, -127, 127);  q = E2M1(x / 2^e);  x^ = 2^e * q

MXFP4, the paper's P/V convention (represented value alpha * q / 6)::

    e = clamp(ceil(log2 amax_block), -127, 127);  q = E2M1(6 * x / 2^e);  x^ = 2^e * (q / 6)

The block max lands in (3, 6] and never clips (contract §1, "paper's P/V convention").

Scaled FP8 (E4M3 or E5M2 payload, one FP32 scale per slice of the tensor)::

    s = amax_slice / FMT_MAX  (amax == 0 -> s = 1);  q = FMT(x / s);  x^ = q * s

or, with ``pow2=True`` (V of the FP8-PV recipes), ``s`` rounded up to the next power of two
(:func:`pow2_ceil`), so that the slice max maps into (FMT_MAX / 2, FMT_MAX]. The E4M3 grid is the same
(3 mantissa bits at any scale); what a power of two buys is that multiplying by ``s`` commutes with
rounding to BF16: ``bf16(y * s) / s == bf16(y)`` exactly. The backward needs that (``reference.py``:
D from the BF16 output must equal dP where one key holds the row's mass).

Non-finite input (documented behaviour): a NaN or +-Inf poisons the smallest unit whose scale it
enters, so it can never be mistaken for a finite value. For NVFP4 the global scale of the group
becomes NaN and every block of the group gets the E4M3 NaN scale code 0x7F (payload 0); for MXFP4
the block gets the E8M0 NaN code 0xFF (payload 0); for FP8 the slice scale becomes NaN and every
element of the slice the NaN code 0x7F (E4M3 and E5M2 alike). In all
cases ``dequantize`` returns NaN for that unit. Training catches the NaN in the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import (
    E2M1_MAX,
    E4M3_MAX,
    E4M3_NAN,
    E5M2_MAX,
    E8M0_BIAS,
    E8M0_NAN,
    decode_e2m1,
    decode_e4m3,
    decode_e8m0,
    encode_e2m1,
    encode_e4m3,
    pack_e2m1,
    unpack_e2m1,
)

__all__ = [
    "FP8_FORMATS",
    "MXFP4_BLOCK",
    "NVFP4_BLOCK",
    "FP8Tensor",
    "MXFP4Tensor",
    "NVFP4Tensor",
    "amax_scale",
    "nvfp4_global_scale",
    "pow2_ceil",
    "quantize_fp8",
    "quantize_fp8_key_groups",
    "quantize_mxfp4",
    "quantize_mxfp4_paper",
    "quantize_nvfp4",
]

NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
NVFP4_GLOBAL_DIVISOR = E4M3_MAX * E2M1_MAX  # 2688
FP8_FORMATS = {"e4m3": (torch.float8_e4m3fn, E4M3_MAX), "e5m2": (torch.float8_e5m2, E5M2_MAX)}


def ieee_div(a: torch.Tensor, b: float | torch.Tensor) -> torch.Tensor:
    """Elementwise IEEE round-to-nearest division ``a / b`` in float32, also for a scalar ``b``."""
    if not isinstance(b, torch.Tensor) or b.dim() == 0:
        b = torch.full_like(a, float(b))
    return a / b


def _check_blocked(x: torch.Tensor, block: int, who: str) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"{who}: expected a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
    if x.dim() == 0 or x.shape[-1] % block:
        raise ValueError(
            f"{who}: the last dim ({x.shape[-1] if x.dim() else 'scalar'}) must be a multiple of the "
            f"block size {block}; pad the tensor or use a format with a smaller block"
        )


@dataclass(frozen=True)
class NVFP4Tensor:
    """NVFP4 payload and scales of a tensor of shape ``[..., D]``.

    Attributes:
        payload: uint8 ``[..., D // 2]``, two E2M1 codes per byte (element 2i in the low nibble).
        block_scale: uint8 ``[..., D // 16]`` E4M3 codes.
        global_scale: float32, broadcastable to ``[..., 1]`` (e.g. ``[B, H, 1, 1]`` per head).
    """

    payload: torch.Tensor
    block_scale: torch.Tensor
    global_scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.payload.shape[:-1], self.payload.shape[-1] * 2))

    def scaled_payload(self) -> torch.Tensor:
        """``s_b * q`` as float32 ``[..., D]`` without the global scale (exact in BF16 too)."""
        q = decode_e2m1(unpack_e2m1(self.payload))
        # torch's float8_e4m3fn view decodes every code exactly like formats.decode_e4m3 (tested)
        s = self.block_scale.view(torch.float8_e4m3fn).float().repeat_interleave(NVFP4_BLOCK, dim=-1)
        return s * q

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``(s_b * q) * g`` in float32, cast to ``dtype``."""
        return (self.scaled_payload() * self.global_scale).to(dtype)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.payload, self.block_scale, self.global_scale))


@dataclass(frozen=True)
class MXFP4Tensor:
    """MXFP4 payload of a tensor ``[..., N]`` with one E8M0 scale per 32 elements.

    Attributes:
        payload: uint8 ``[..., N // 2]`` packed E2M1 codes.
        block_scale: uint8 ``[..., N // 32]`` E8M0 codes.
        paper_convention: False for OCP (x^ = 2^e q), True for the paper's P/V form (2^e q / 6).
    """

    payload: torch.Tensor
    block_scale: torch.Tensor
    paper_convention: bool

    def codes(self) -> torch.Tensor:
        """E2M1 values q (float32, ``[..., N]``)."""
        return decode_e2m1(unpack_e2m1(self.payload))

    def scales(self) -> torch.Tensor:
        """Block scales 2^e (float32, ``[..., N // 32]``; NaN for code 0xFF)."""
        return decode_e8m0(self.block_scale)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """OCP: ``2^e * q``; paper convention: ``2^e * (q / 6)`` (never ``(2^e / 6) * q``)."""
        q = self.codes().to(torch.float64)
        s = decode_e8m0(self.block_scale, dtype=torch.float64).repeat_interleave(MXFP4_BLOCK, dim=-1)
        out = s * (q / 6.0) if self.paper_convention else s * q
        return out.to(dtype)

    def nbytes(self) -> int:
        return self.payload.numel() + self.block_scale.numel()


@dataclass(frozen=True)
class FP8Tensor:
    """Scaled FP8 tensor: ``x^ = data.float() * scale``.

    Attributes:
        data: torch.float8_e4m3fn or torch.float8_e5m2, the input's shape.
        scale: float32, broadcastable to ``data`` (size 1 along the reduced dims).
    """

    data: torch.Tensor
    scale: torch.Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.data.float() * self.scale).to(dtype)

    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()


def amax_scale(x: torch.Tensor, dims: tuple[int, ...], divisor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-slice scale ``amax / divisor`` of ``x`` reduced over ``dims`` (keepdim), and each slice's
    finiteness.

    The one rule of every scaled format here (contract §1-2): IEEE division (:func:`ieee_div`), 1.0
    for an all-zero slice, NaN for a slice holding a NaN or Inf. ``|x|`` and max are exact in x's own
    dtype and amax propagates NaN, so a non-finite slice has a non-finite amax: one reduction pass,
    no FP32 copy of ``x``.

    Returns:
        ``(scale, finite)``: float32 scale and bool, both shaped like ``x`` with ``dims`` kept as size 1.
    """
    amax = x.abs().amax(dim=dims, keepdim=True).float()
    finite = torch.isfinite(amax)
    amax = torch.where(finite, amax, torch.zeros_like(amax))
    scale = ieee_div(amax, divisor)
    scale = torch.where(amax == 0, torch.ones_like(scale), scale)
    return torch.where(finite, scale, torch.full_like(scale, torch.nan)), finite


def pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """The smallest power of two ``>= s``, elementwise, exactly (via ``frexp``, no ``log2``).

    Args:
        s: float32 scales, finite and > 0, or NaN (a poisoned slice).
    Returns:
        float32 powers of two (subnormal ones included, for subnormal ``s``); NaN stays NaN.
    """
    m, e = torch.frexp(s)  # s = m * 2^e, m in [0.5, 1)
    up = torch.ldexp(torch.ones_like(s), torch.where(m == 0.5, e - 1, e))
    return torch.where(torch.isnan(s), s, up)


def nvfp4_global_scale(x: torch.Tensor, dims: tuple[int, ...] | None = None) -> torch.Tensor:
    """NVFP4 global scale ``g = amax / 2688`` over ``dims`` (keepdim), float32.

    Args:
        x: float tensor of any shape.
        dims: the dims reduced for the amax; None = the whole tensor (shape ``[1] * x.dim()``).
            For attention in ``[B, H, S, D]`` layout the per-head scale is ``dims=(2, 3)``.
    Returns:
        float32 tensor; 1.0 where amax == 0; NaN where the group holds a NaN or Inf.
    """
    dims = tuple(range(x.dim())) if dims is None else dims
    return amax_scale(x, dims, NVFP4_GLOBAL_DIVISOR)[0]


def quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor | None = None) -> NVFP4Tensor:
    """Quantize ``x [..., D]`` (D % 16 == 0) to NVFP4 (contract §1).

    Args:
        x: float tensor (BF16 in the attention path); last dim is the blocked dim (head dim).
        global_scale: float32 broadcastable to ``x[..., :1]``; None = one per-tensor scale from
            :func:`nvfp4_global_scale`.
    Returns:
        :class:`NVFP4Tensor`.
    Raises:
        ValueError: if D is not a multiple of 16. TypeError: non-float input.
    """
    _check_blocked(x, NVFP4_BLOCK, "quantize_nvfp4")
    g = nvfp4_global_scale(x) if global_scale is None else global_scale.float()
    xf = x.float()
    xb = xf.unflatten(-1, (-1, NVFP4_BLOCK))
    gb = g.unsqueeze(-1)  # broadcast over (block, element)
    bad = ~torch.isfinite(xb).all(-1, keepdim=True) | ~torch.isfinite(gb)
    xb_clean = torch.where(bad, torch.zeros_like(xb), xb)
    amax_b = xb_clean.abs().amax(-1, keepdim=True)
    s_code = encode_e4m3(ieee_div(ieee_div(amax_b, 6.0), gb))  # float32 divisions in contract order
    s_code = torch.where(bad, torch.full_like(s_code, E4M3_NAN), s_code)
    s_b = decode_e4m3(s_code)
    denom = s_b * gb
    ok = (denom > 0) & torch.isfinite(denom)
    safe = torch.where(ok, denom, torch.ones_like(denom))
    q = torch.where(ok, xb_clean / safe, torch.zeros_like(xb_clean))
    codes = encode_e2m1(q.clamp(-E2M1_MAX, E2M1_MAX)).flatten(-2)
    return NVFP4Tensor(payload=pack_e2m1(codes), block_scale=s_code.squeeze(-1), global_scale=g)


def _log2_floor_ceil(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact floor(log2 a) and ceil(log2 a) for finite a > 0 (int64), via frexp."""
    m, e = torch.frexp(amax.to(torch.float64))
    fl = e.to(torch.int64) - 1  # a = m 2^e, m in [0.5, 1)
    ce = torch.where(m == 0.5, fl, fl + 1)
    return fl, ce


def _quantize_mx(x: torch.Tensor, paper: bool, who: str) -> MXFP4Tensor:
    _check_blocked(x, MXFP4_BLOCK, who)
    xb = x.to(torch.float64).unflatten(-1, (-1, MXFP4_BLOCK))
    bad = ~torch.isfinite(xb).all(-1, keepdim=True)
    xb = torch.where(bad, torch.zeros_like(xb), xb)
    amax = xb.abs().amax(-1, keepdim=True)
    zero = amax == 0
    fl, ce = _log2_floor_ceil(torch.where(zero, torch.ones_like(amax), amax))
    e = (ce if paper else fl - 2).clamp(-E8M0_BIAS, E8M0_BIAS)
    e = torch.where(zero, torch.full_like(e, -E8M0_BIAS), e)
    scaled = torch.ldexp(xb, (-e).to(torch.float64))  # exact power-of-two scaling in float64
    if paper:
        scaled = scaled * 6.0
    codes = encode_e2m1(scaled.clamp(-E2M1_MAX, E2M1_MAX)).flatten(-2)
    s_code = (e + E8M0_BIAS).to(torch.uint8)
    s_code = torch.where(bad, torch.full_like(s_code, E8M0_NAN), s_code)
    return MXFP4Tensor(payload=pack_e2m1(codes), block_scale=s_code.squeeze(-1), paper_convention=paper)


def quantize_mxfp4(x: torch.Tensor) -> MXFP4Tensor:
    """OCP MX v1.0 MXFP4 along the last dim (multiple of 32): e = floor(log2 amax) - 2.

    Values above 6 * 2^e clip to 6 * 2^e. A zero block gets scale code 0 (2^-127), payload 0.
    """
    return _quantize_mx(x, paper=False, who="quantize_mxfp4")


def quantize_mxfp4_paper(x: torch.Tensor) -> MXFP4Tensor:
    """MXFP4 in the paper's P/V convention: e = ceil(log2 amax), x^ = 2^e * (q / 6).

    The block max maps into (3, 6] and never clips. Used for V (blocks along tokens) in the
    Direct-P recipes; P's codes come from the Direct-P classifier (``direct_p.py``) instead.
    """
    return _quantize_mx(x, paper=True, who="quantize_mxfp4_paper")


def quantize_fp8(x: torch.Tensor, fmt: str, dims: tuple[int, ...], *, pow2: bool = False) -> FP8Tensor:
    """Scaled FP8: one FP32 scale ``amax / FMT_MAX`` per slice, the amax taken over ``dims``.

    Granularities used by the recipes on ``[B, H, S, D]`` tensors: per token ``dims=(-1,)``
    (Q/K of the ``fp8`` recipe), per channel ``dims=(-2,)`` with ``pow2=True`` (V), per head
    ``dims=(-2, -1)`` (dO in backward).

    Args:
        x: float tensor.
        fmt: "e4m3" or "e5m2".
        dims: dims reduced for the amax (kept with size 1 in ``scale``).
        pow2: round each scale up to a power of two (:func:`pow2_ceil`; module docstring).
    Returns:
        :class:`FP8Tensor` with ``data`` of torch's float8 dtype and float32 ``scale``.
    Raises:
        ValueError: unknown ``fmt`` or empty ``dims``.
    """
    if fmt not in FP8_FORMATS:
        raise ValueError(f"quantize_fp8: fmt must be one of {sorted(FP8_FORMATS)}, got {fmt!r}")
    if not dims:
        raise ValueError("quantize_fp8: dims must name at least one reduced dim")
    dtype, fmax = FP8_FORMATS[fmt]
    scale, finite = amax_scale(x, dims, fmax)
    if pow2:
        scale = pow2_ceil(scale)
    data = (x.float() / scale).clamp(-fmax, fmax).to(dtype)
    # non-finite slices: every element gets the canonical NaN code 0x7F (not a sign-dependent NaN)
    data = torch.where(finite, data.view(torch.uint8), torch.full_like(data.view(torch.uint8), 0x7F)).view(
        dtype
    )
    return FP8Tensor(data=data, scale=scale)


def quantize_fp8_key_groups(k: torch.Tensor, keys: int, *, pow2: bool = False) -> FP8Tensor:
    """E4M3 K ``[B, H, S, D]`` with one scale per ``keys`` consecutive keys of each (batch, head),
    counted from key 0: amax over the group's keys and channels (the last group may be shorter),
    :func:`quantize_fp8`'s rule otherwise (a non-finite group: NaN scale, code 0x7F for all its
    elements; ``pow2``: scales rounded up to powers of two). The candidate K recipe of the forward
    issue's K-scale decision (``bench/k_scale_numerics.py``, the CuTe forward's ``k_group``); the
    ``fp8`` recipe's K is per token.

    Returns:
        data ``[B, H, S, D]`` float8_e4m3fn and scale ``[B, H, S, 1]`` FP32, the group's scale
        repeated per key (so that every reader of per-token K scales reads it unchanged).
    Raises:
        ValueError: ``keys`` < 1 or ``k`` not 4-D.
    """
    if keys < 1 or k.dim() != 4:
        raise ValueError(
            f"quantize_fp8_key_groups: needs keys >= 1 and K [B, H, S, D]; got {keys}, {tuple(k.shape)}"
        )
    b, h, s, d = k.shape
    pad = -s % keys
    kp = torch.cat([k.float(), k.new_zeros(b, h, pad, d, dtype=torch.float32)], dim=2) if pad else k.float()
    t = quantize_fp8(kp.reshape(b, h, (s + pad) // keys, keys, d), "e4m3", dims=(-2, -1), pow2=pow2)
    data = t.data.reshape(b, h, s + pad, d)[:, :, :s].contiguous()
    scale = t.scale.expand(b, h, (s + pad) // keys, keys, 1).reshape(b, h, s + pad, 1)[:, :, :s]
    return FP8Tensor(data=data, scale=scale.contiguous())
