"""The ``cute`` backend: CUTLASS DSL (CuTe) forward kernel for Hopper (sm_90).

Its declaration is ``SPEC`` in this package's ``__init__``; this module (imported on first use) needs
``nvidia-cutlass-dsl`` and ``flash-attn-4`` (``pip install 'fp4-attention-pretrain[cute]'``).

Scope, said plainly:
* Forward of recipe ``fp8`` on sm_90 (``fwd_sm90.FP8ForwardSm90``), head dims 64 and 128, any
  sequence lengths, causal (bottom-right) or not, GQA.
* Backward: the Triton backward kernels (``TritonBackend.backward``) on the same saved state, V put
  back in key order. There is no CuTe backward yet; this is the documented composition, not a
  fallback.
* Quantization of Q/K/V: the Triton quantizers (bytes equal ``numerics.quant``'s). The V quantizer
  writes V transposed with its keys permuted within each 16
  (:data:`~fp4_attention.backends.pv_layout.V_PERM16`) and padded to a multiple of 16 keys, the
  kernel's operand; that is the ``v`` of the :class:`SavedState` this backend writes.
* Compiled kernels are cached per (head dim, GQA group, causal, tiles); the first call of a key
  compiles (seconds; :data:`COMPILE_SECONDS` records each compile's wall time).
"""

from __future__ import annotations

import time

import torch

from ...numerics.operands import SavedState
from ...numerics.quant import FP8Tensor
from ...numerics.recipes import Recipe
from ..pv_layout import padded_keys, unpermute_v_keys
from ..triton.backend import TritonBackend
from ..triton.kernels import LOG2E
from ..triton.quant import quantize_fp8_rows, quantize_fp8_v_transposed
from . import SPEC

try:
    from cutlass import cute
    from flash_attn.cute.cute_dsl_utils import to_cute_tensor

    from .fwd_sm90 import FP8ForwardSm90
except ImportError as err:  # re-raised by backends.get_backend with the alternative named
    raise ImportError(
        f"the cute backend needs nvidia-cutlass-dsl and flash-attn-4 ({err}); "
        "pip install 'fp4-attention-pretrain[cute]', or use backend='triton'"
    ) from err

__all__ = [
    "COMPILE_SECONDS",
    "DEFAULT_TILES",
    "CuteBackend",
    "forward_fp8",
    "kernel_operands",
    "triton_state",
    "unpermute_v",
]

# (tile_m, tile_n, stages): 128 query rows on two consumer warpgroups, 128 keys per KV tile.
# Tested against the reference on the H200: (128, 128, 2) and (128, 96, 2); timed also (128, 64, 2).
DEFAULT_TILES = (128, 128, 2)
SUPPORTED_TILES = ((128, 128, 2), (128, 96, 2), (128, 64, 2))
_CACHE: dict = {}
COMPILE_SECONDS: dict = {}


def unpermute_v(v_s: FP8Tensor, seq_k: int) -> FP8Tensor:
    """V saved in the kernel's layout -> data ``[B, Hkv, D, seq_k]`` in key order (an exact byte gather)."""
    return FP8Tensor(data=unpermute_v_keys(v_s.data, seq_k), scale=v_s.scale)


def triton_state(state: SavedState) -> SavedState:
    """The same saved tensors with V in key order, as the Triton backward (and the reference) read it."""
    sk = state.k.data.shape[2]
    return SavedState(q=state.q, k=state.k, v=unpermute_v(state.v, sk), out=state.out, lse=state.lse)


def _compiled(d: int, group: int, causal: bool, tiles, args, kernel_options: dict):
    key = (d, group, causal, tiles, tuple(sorted(kernel_options.items())))
    if key not in _CACHE:
        tile_m, tile_n, stages = tiles
        kernel = FP8ForwardSm90(
            d, group, causal, tile_m=tile_m, tile_n=tile_n, num_stages=stages, **kernel_options
        )
        q, k, vt, out, lse, row, col, vs = args
        cute_args = [to_cute_tensor(t, leading_dim=3) for t in (q, k)]
        cute_args.append(to_cute_tensor(vt, leading_dim=1))
        cute_args.append(to_cute_tensor(out, leading_dim=3))
        cute_args += [to_cute_tensor(t, assumed_align=4, leading_dim=2) for t in (lse, row, col, vs)]
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        t0 = time.perf_counter()
        _CACHE[key] = cute.compile(kernel, *cute_args, stream, options="--enable-tvm-ffi")
        COMPILE_SECONDS[key] = time.perf_counter() - t0
    return _CACHE[key]


def _check_operands(q8, k8, vt, row_r, col, v_scale, tiles) -> None:
    if tiles not in SUPPORTED_TILES:
        raise ValueError(f"cute backend: tiles {tiles} not supported; use one of {SUPPORTED_TILES}")
    for name, t, dtype in (
        ("q8", q8, torch.float8_e4m3fn),
        ("k8", k8, torch.float8_e4m3fn),
        ("vt_perm", vt, torch.float8_e4m3fn),
        ("row_r", row_r, torch.float32),
        ("col", col, torch.float32),
        ("v_scale", v_scale, torch.float32),
    ):
        # E4M3 operands are TMA-loaded (contiguous); the FP32 scales need unit stride on their last dim
        laid_out = t.is_contiguous() if dtype == torch.float8_e4m3fn else t.stride(-1) == 1
        if t.dtype != dtype or not t.is_cuda or not laid_out:
            raise ValueError(
                f"forward_fp8: {name} must be a CUDA {dtype} tensor "
                f"({'contiguous' if dtype == torch.float8_e4m3fn else 'unit last stride'}), got "
                f"{t.dtype} on {t.device} with strides {tuple(t.stride())}"
            )
    b, hq, sq, d = q8.shape
    _, hkv, sk, _ = k8.shape
    for name, t, shape in (
        ("k8", k8, (b, hkv, sk, d)),
        ("vt_perm", vt, (b, hkv, d, padded_keys(sk))),
        ("row_r", row_r, (b, hq, sq)),
        ("col", col, (b, hkv, sk)),
        ("v_scale", v_scale, (b, hkv, d)),
    ):
        if tuple(t.shape) != shape:
            raise ValueError(f"forward_fp8: {name} has shape {tuple(t.shape)}, expected {shape}")
    if hq % hkv:
        raise ValueError(f"forward_fp8: query heads {hq} not a multiple of KV heads {hkv}")


def kernel_operands(q_s: FP8Tensor, k_s: FP8Tensor, v_s: FP8Tensor, softmax_scale: float) -> tuple:
    """The operands of :func:`forward_fp8` from quantized Q/K/V as :class:`SavedState` saves them:
    ``(q8, k8, vt_perm, row_r, col, v_scale)``, ``row_r`` = Q token scale * softmax_scale * log2 e."""
    return (
        q_s.data,
        k_s.data,
        v_s.data,
        q_s.scale.squeeze(-1) * (softmax_scale * LOG2E),
        k_s.scale.squeeze(-1),
        v_s.scale.squeeze(2).contiguous(),
    )


def quantize_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[FP8Tensor, FP8Tensor, FP8Tensor]:
    """BF16 ``q [B, Hq, Sq, D]``, ``k, v [B, Hkv, Sk, D]`` (CUDA) -> the quantized Q/K/V the kernel
    reads and :class:`SavedState` saves: Q and K E4M3 per token, V E4M3 per channel, transposed and
    in the ``pv_layout`` key order (Triton quantizers). :func:`kernel_operands` makes them the
    kernel's arguments."""
    return (
        quantize_fp8_rows(q.contiguous()),
        quantize_fp8_rows(k.contiguous()),
        quantize_fp8_v_transposed(v, perm16=True),
    )


def forward_fp8(q8, k8, vt_perm, row_r, col, v_scale, *, causal: bool, tiles=DEFAULT_TILES, **kernel_options):
    """Run the CuTe ``fp8`` forward on prepared operands.

    Args:
        q8: E4M3 ``[B, Hq, Sq, D]`` contiguous; k8: E4M3 ``[B, Hkv, Sk, D]`` contiguous.
        vt_perm: E4M3 ``[B, Hkv, D, Sk16]`` in the ``pv_layout`` key order
            (``quantize_fp8_v_transposed(v, perm16=True).data``).
        row_r: FP32 ``[B, Hq, Sq]``, Q token scale times softmax_scale * log2 e.
        col: FP32 ``[B, Hkv, Sk]``, K token scale; v_scale: FP32 ``[B, Hkv, D]``.
        kernel_options: the measurement options of :class:`FP8ForwardSm90` (promotions, overlap,
            schedule, Direct-P; all off or at the contract's setting by default).
    Returns:
        out BF16 ``[B, Hq, Sq, D]`` and the natural-log LSE FP32 ``[B, Hq, Sq]``.
    Raises:
        ValueError: operands of the wrong dtype, layout or shape, or tiles outside ``SUPPORTED_TILES``.
    """
    _check_operands(q8, k8, vt_perm, row_r, col, v_scale, tuple(tiles))
    b, hq, sq, d = q8.shape
    hkv = k8.shape[1]
    out = torch.empty((b, hq, sq, d), dtype=torch.bfloat16, device=q8.device)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q8.device)
    args = (
        q8.permute(0, 2, 1, 3),
        k8.permute(0, 2, 1, 3),
        vt_perm.permute(0, 3, 1, 2),
        out.permute(0, 2, 1, 3),
        lse,
        row_r,
        col,
        v_scale,
    )
    fn = _compiled(d, hq // hkv, causal, tuple(tiles), args, kernel_options)
    fn(*[t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in args])
    return out, lse


class CuteBackend:
    """CuTe DSL forward (sm_90, recipe ``fp8``) + Triton backward; options ``tiles`` =
    ``(tile_m, tile_n, stages)`` for benchmarks and tests."""

    spec = SPEC

    def forward(self, q, k, v, recipe: Recipe, *, causal: bool, softmax_scale: float, tiles=DEFAULT_TILES):
        """BF16 ``q [B, Hq, Sq, D]``, ``k, v [B, Hkv, Sk, D]`` (CUDA, sm_90) -> BF16 out, FP32 natural-log
        LSE ``[B, Hq, Sq]`` and the :class:`SavedState`. Quantizes Q/K per token and V per channel
        (Triton quantizers, V into the kernel's layout), then runs the kernel (``forward_fp8``).
        Raises ValueError for ``tiles`` outside ``SUPPORTED_TILES``."""
        q_s, k_s, v_s = quantize_inputs(q, k, v)
        out, lse = forward_fp8(*kernel_operands(q_s, k_s, v_s, softmax_scale), causal=causal, tiles=tiles)
        return out, lse, SavedState(q=q_s, k=k_s, v=v_s, out=out, lse=lse)

    def backward(
        self, state: SavedState, dout, recipe: Recipe, *, causal: bool, softmax_scale: float, tiles=None
    ):
        """The Triton backward kernels on this backend's forward state, V back in key order (module
        docstring)."""
        return TritonBackend().backward(
            triton_state(state), dout, recipe, causal=causal, softmax_scale=softmax_scale
        )
