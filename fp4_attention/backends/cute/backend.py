"""The ``cute`` backend: CUTLASS DSL (CuTe) forward kernel for Hopper (sm_90).

Its declaration is ``SPEC`` in this package's ``__init__``; this module (imported on first use) needs
``nvidia-cutlass-dsl`` and ``flash-attn-4`` (``pip install 'fp4-attention-pretrain[cute]'``).

Scope, said plainly:
* Forward of recipes ``fp8`` and ``nvfp4qk_fp8pv`` on sm_90 (``fwd_sm90.FP8ForwardSm90``; the
  latter with BF16 Q/K operands), head dims 64 and 128, any sequence lengths, causal (bottom-right)
  or not, GQA.
* Backward of recipes ``fp8`` and ``nvfp4qk_fp8pv`` on sm_90 (``bwd_sm90.FP8BackwardSm90``) on the
  forward's saved state (no re-quantization of Q/K): same head dims, lengths, masks and GQA; for
  NVFP4 Q/K the kernel recomputes S^T as a BF16 wgmma on their exact decodes (``qk_bf16``, the
  forward's QK product). Its operands are prepared by Triton kernels (:func:`backward_operands`: dO
  in E5M2 and D, dO^T in the kernel's query order, BF16 images of the Q/K payloads for the dQ/dK
  products, V back in key order); one Triton kernel (``triton/bwd_post.py``) turns the FP32 dQ (and,
  for GQA, dK/dV) accumulators into BF16.
* Quantization of Q/K/V: the Triton quantizers (bytes equal ``numerics.quant``'s), with RoPE
  (``attention(..., rope=...)``) applied inside the FP8 and NVFP4 Q/K quantizers
  (``triton/rope.py``). The V quantizer writes V transposed with its keys permuted within each 16
  (:data:`~fp4_attention.backends.pv_layout.V_PERM16`) and padded to a multiple of 16 keys, the
  kernel's operand; that is the ``v`` of the :class:`SavedState` this backend writes.
* Layouts (recipe ``fp8``): the quantizers read Q/K (and V) in place from the caller's strides (the
  ``[B, H, S, D]`` views of ``bshd``/``sbhd`` tensors), dO is read in place, and the output and the
  gradients are allocated in the caller's memory order (``layouts.empty_in_layout_of``), so no layout
  copy is made on either pass. ``nvfp4qk_fp8pv`` likewise: the per-token row/col vectors of its
  per-head global scales are written by the quantizer and the K/V kernel, or read through a
  stride-0 view (the dO kernel), not broadcast by copies.
* Compiled kernels are cached per (head dim, GQA group, causal, tiles); the first call of a key
  compiles (seconds; :data:`COMPILE_SECONDS` records each compile's wall time). With
  ``FP4_ATTENTION_CUTE_CACHE_DIR`` set they are also kept on disk and later processes load them
  (``compile_cache.py``); a machine without a GPU can fill that cache (``prebuild.py``: the compile
  functions take CPU stand-ins of their operands).
"""

from __future__ import annotations

import json
import math
import os
import time

import torch

from ...numerics.operands import SavedState
from ...numerics.quant import FP8Tensor, NVFP4Tensor
from ...numerics.recipes import Recipe
from ..dout import LOG2E
from ..layouts import empty_in_layout_of
from ..pv_layout import padded_keys, unpermute_v_keys
from ..triton.bwd_kv import backward_kv_operands
from ..triton.bwd_post import convert_accumulators
from ..triton.dout_quant import quantize_dout_fused
from ..triton.quant_fp8 import quantize_fp8_key_groups, quantize_fp8_rows, quantize_fp8_rows_pair
from ..triton.quant_nvfp4 import decode_nvfp4_rows, quantize_nvfp4_heads
from ..triton.quant_v import quantize_fp8_v_transposed
from ..triton.rope import quantize_fp8_rows_pair_rope, quantize_nvfp4_heads_rope, rope_rows_pair
from . import SPEC

try:
    import cutlass
    from cutlass import cute

    from .arguments import cute_operand
    from .bwd_sm90 import FP8BackwardSm90
    from .compile_cache import make_cache
    from .fwd_sm90 import LIFT, FP8ForwardSm90
except ImportError as err:  # re-raised by backends.get_backend with the alternative named
    raise ImportError(
        f"the cute backend needs nvidia-cutlass-dsl and flash-attn-4 ({err}); "
        "pip install 'fp4-attention-pretrain[cute]', or use backend='triton'"
    ) from err

__all__ = [
    "BWD_TILES",
    "COMPILE_SECONDS",
    "DEFAULT_TILES",
    "D128_TILES",
    "CuteBackend",
    "backward_fp8",
    "backward_operands",
    "default_tiles",
    "forward_fp8",
    "forward_key",
    "kernel_operands",
    "postprocess_gradients",
    "triton_state",
    "unpermute_v",
]

# (tile_m, tile_n, stages): 128 query rows on two consumer warpgroups, tile_n keys per KV tile.
# Every kernel test runs at both defaults (128, 128, 2) and (128, 192, 2), causal or not; the others
# match the reference in test_cute_backend.py's test_other_tiles_match_reference. Measured on the
# H200, kernel only, D128: 192 keys win non-causal (B2 H32/32 S8192: 3.109 against 3.321 ms at 128 in
# results/cute_tiles_h200, 5-6% in every run since) and B1 H32/8 S4096 causal (1.8-2.1% in each of the
# four runs that timed both, results/cute_fwd_schedule2_h200); at B4 causal the two are within noise
# (192 faster by 2.0-2.7% in three runs, slower by 0.5-0.9% in three). 160 keys and three K/V stages
# were never the fastest and are not offered; 192 query rows (three consumer warpgroups at 160
# registers) lost 4-16% (results/cute_fwd_schedule2_h200) and are not offered either.
D128_TILES = (128, 192, 2)
DEFAULT_TILES = (128, 128, 2)
SUPPORTED_TILES = (
    (128, 128, 2),
    (128, 96, 2),
    (128, 64, 2),
    (128, 192, 2),
)


def default_tiles(head_dim: int) -> tuple[int, int, int]:
    """The forward's tiles when none are given: :data:`D128_TILES` at head dim 128, causal or not,
    :data:`DEFAULT_TILES` at 64 (the measurements above; D64 was not timed)."""
    return D128_TILES if head_dim == 128 else DEFAULT_TILES


BWD_TILES = (64, 128)  # (query rows per step, keys per CTA) of the backward: FA4's head-dim-128 tiles
_CACHE = make_cache()  # in memory; also on disk with $FP4_ATTENTION_CUTE_CACHE_DIR (compile_cache.py)
COMPILE_SECONDS: dict = {}


def unpermute_v(v_s: FP8Tensor, seq_k: int) -> FP8Tensor:
    """V saved in the kernel's layout -> data ``[B, Hkv, D, seq_k]`` in key order (an exact byte gather)."""
    return FP8Tensor(data=unpermute_v_keys(v_s.data, seq_k), scale=v_s.scale)


def _seq_k(k_s) -> int:
    """Keys of a saved K (FP8Tensor data or NVFP4Tensor, both [B, Hkv, Sk, ...])."""
    return k_s.shape[2] if isinstance(k_s, NVFP4Tensor) else k_s.data.shape[2]


def triton_state(state: SavedState) -> SavedState:
    """The same saved tensors with V in key order, as the Triton backward (and the reference) read it."""
    return SavedState(
        q=state.q, k=state.k, v=unpermute_v(state.v, _seq_k(state.k)), out=state.out, lse=state.lse
    )


# FP8ForwardSm90's options at their defaults: left out of the compiled-kernel key, so that one
# kernel has one key however its caller spells it (qk_bf16=False or nothing; prebuild.py's keys)
_FWD_OPTION_DEFAULTS = {"qk_bf16": False, "k_group": 0}


def forward_key(d: int, group: int, causal: bool, tiles, kernel_options: dict) -> tuple:
    """The compiled-kernel cache key of the forward (``_CACHE``, and on disk ``compile_cache``):
    ``(d, group, causal, tiles, options)`` with the options that differ from
    ``FP8ForwardSm90``'s defaults, sorted."""
    options = {k: v for k, v in kernel_options.items() if _FWD_OPTION_DEFAULTS.get(k, object()) != v}
    return (d, group, causal, tuple(tiles), tuple(sorted(options.items())))


def _compiled(d: int, group: int, causal: bool, tiles, args, kernel_options: dict):
    key = forward_key(d, group, causal, tiles, kernel_options)
    if key not in _CACHE:
        tile_m, tile_n, stages = tiles
        kernel = FP8ForwardSm90(
            d, group, causal, tile_m=tile_m, tile_n=tile_n, num_stages=stages, **kernel_options
        )
        q, k, vt, out, lse, row, col, vs = args
        cute_args = [cute_operand(t, leading_dim=3) for t in (q, k)]
        cute_args.append(cute_operand(vt, leading_dim=1))
        cute_args.append(cute_operand(out, leading_dim=3))
        cute_args += [cute_operand(t, assumed_align=4, leading_dim=2) for t in (lse, row, col, vs)]
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        t0 = time.perf_counter()
        # the FP32 scalar qk_scale_log2 (a runtime argument: one kernel for every softmax scale)
        _CACHE[key] = cute.compile(
            kernel, *cute_args, cutlass.Float32(1.0), stream, options="--enable-tvm-ffi"
        )
        _record_compile(key, time.perf_counter() - t0)
    return _CACHE[key]


def _record_compile(key: tuple, seconds: float) -> None:
    """:data:`COMPILE_SECONDS`, and with ``FP4_ATTENTION_CUTE_COMPILE_LOG`` set one JSON line per
    compile appended to that file (``{"key": ..., "seconds": ...}``): which kernels a run compiled
    rather than loaded, e.g. those a prebuilt cache (``prebuild.py``) lacked."""
    COMPILE_SECONDS[key] = seconds
    path = os.environ.get("FP4_ATTENTION_CUTE_COMPILE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"key": repr(key), "seconds": round(seconds, 2)}) + "\n")


def _check_operands(q8, k8, vt, row, col, v_scale, tiles, qk_bf16=False) -> None:
    if tiles not in SUPPORTED_TILES:
        raise ValueError(f"cute backend: tiles {tiles} not supported; use one of {SUPPORTED_TILES}")
    qk = torch.bfloat16 if qk_bf16 else torch.float8_e4m3fn
    for name, t, dtype in (
        ("q8", q8, qk),
        ("k8", k8, qk),
        ("vt_perm", vt, torch.float8_e4m3fn),
        ("row", row, torch.float32),
        ("col", col, torch.float32),
        ("v_scale", v_scale, torch.float32),
    ):
        # E4M3 operands are TMA-loaded (contiguous); the FP32 scales need unit stride on their last dim
        operand = dtype != torch.float32
        laid_out = t.is_contiguous() if operand else t.stride(-1) == 1
        if t.dtype != dtype or not t.is_cuda or not laid_out:
            raise ValueError(
                f"forward_fp8: {name} must be a CUDA {dtype} tensor "
                f"({'contiguous' if operand else 'unit last stride'}), got "
                f"{t.dtype} on {t.device} with strides {tuple(t.stride())}"
            )
    b, hq, sq, d = q8.shape
    _, hkv, sk, _ = k8.shape
    for name, t, shape in (
        ("k8", k8, (b, hkv, sk, d)),
        ("vt_perm", vt, (b, hkv, d, padded_keys(sk))),
        ("row", row, (b, hq, sq)),
        ("col", col, (b, hkv, sk)),
        ("v_scale", v_scale, (b, hkv, d)),
    ):
        if tuple(t.shape) != shape:
            raise ValueError(f"forward_fp8: {name} has shape {tuple(t.shape)}, expected {shape}")
    if hq % hkv:
        raise ValueError(f"forward_fp8: query heads {hq} not a multiple of KV heads {hkv}")


def kernel_operands(
    q_s: FP8Tensor | NVFP4Tensor,
    k_s: FP8Tensor | NVFP4Tensor,
    v_s: FP8Tensor,
    softmax_scale: float,
    decoded=None,
) -> tuple:
    """The operands of :func:`forward_fp8` from quantized Q/K/V as :class:`SavedState` saves them:
    ``(q_op, k_op, vt_perm, row, col, v_scale, qk_scale_log2)``: ``row`` the Q token scales (no
    copy of them: the kernel multiplies each by ``qk_scale_log2`` = softmax_scale * log2 e, a float).
    FP8 Q/K: the E4M3 payloads and their token scales. NVFP4 Q/K: the BF16 decode ``s_b * q`` and
    the per-head global scales broadcast per token (as the Triton backend): ``decoded`` as
    :func:`quantize_nvfp4_inputs` returns it when at hand, else decoded and broadcast here."""
    if isinstance(q_s, NVFP4Tensor):
        b, hq, sq, _ = q_s.shape
        hkv, sk = k_s.shape[1], k_s.shape[2]
        if decoded is not None:
            q_op, k_op, row, col = decoded
        else:
            q_op, k_op = decode_nvfp4_rows(q_s), decode_nvfp4_rows(k_s)
            row = q_s.global_scale.reshape(b, hq, 1).expand(b, hq, sq).contiguous()
            col = k_s.global_scale.reshape(b, hkv, 1).expand(b, hkv, sk).contiguous()
    else:
        q_op, k_op, row, col = q_s.data, k_s.data, q_s.scale.squeeze(-1), k_s.scale.squeeze(-1)
    return q_op, k_op, v_s.data, row, col, v_s.scale.squeeze(2).contiguous(), softmax_scale * LOG2E


def quantize_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale_keys: int = 1, rope=None
) -> tuple[FP8Tensor, FP8Tensor, FP8Tensor]:
    """BF16 ``q [B, Hq, Sq, D]``, ``k, v [B, Hkv, Sk, D]`` (CUDA) -> the quantized Q/K/V the kernel
    reads and :class:`SavedState` saves: Q and K E4M3 per token (K per ``k_scale_keys`` keys when
    that is not 1, the scale repeated per key: ``Recipe.k_scale_keys``), V E4M3 per channel,
    transposed and in the ``pv_layout`` key order (Triton quantizers). :func:`kernel_operands`
    makes them the kernel's arguments. With ``rope`` (a ``RoPETables``) those of the RoPE'd Q and K:
    inside the quantizer for Q and K per token, by ``rope_rows_pair`` first for K per group of keys."""
    # V's amax words: zeroed by the Q/K pair kernel's launch when that is the Q/K launch, else by a fill
    pair = rope is None and k_scale_keys == 1
    words, (zeroed,) = _words(v, [v.shape[0] * v.shape[1] * v.shape[3]], fill=not pair)
    # Q and K read in place from any [B, H, S, D] strides; per token, in one launch
    if pair:
        q_s, k_s = quantize_fp8_rows_pair(q, k, zero=words)
    elif k_scale_keys == 1:
        q_s, k_s = quantize_fp8_rows_pair_rope(q, k, (rope.cos_q, rope.sin_q), (rope.cos_k, rope.sin_k))
    else:
        if rope is not None:  # K per group of keys: RoPE as its own pass first
            q, k = rope_rows_pair(q, k, (rope.cos_q, rope.sin_q), (rope.cos_k, rope.sin_k))
        q_s, k_s = quantize_fp8_rows(q), quantize_fp8_key_groups(k, k_scale_keys)
    return q_s, k_s, quantize_fp8_v_transposed(v, perm16=True, zeroed=zeroed)


def _words(x: torch.Tensor, counts: list[int], fill: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The amax passes' words of a forward's quantizers in one FP32 buffer on ``x``'s device: the
    buffer and its parts of ``2 * n`` words per count ``n`` (each quantizer's amax and flag:
    ``triton.quant_common.amax_and_flag_words``), zero-filled by one launch for all of them (``fill``) or
    left for a kernel to zero (the Q/K pair quantizer's ``zero``). Each part starts on a 16-byte
    boundary (its size rounded up to 4 words), as a buffer of its own would: Triton specializes a
    kernel on a pointer's 16-byte alignment."""
    padded = [-(-2 * n // 4) * 4 for n in counts]
    make = torch.zeros if fill else torch.empty
    words = make(sum(padded), dtype=torch.float32, device=x.device)
    return words, [part[: 2 * n] for part, n in zip(words.split(padded), counts, strict=True)]


def quantize_nvfp4_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope=None) -> tuple:
    """BF16 ``q [B, Hq, Sq, D]``, ``k, v [B, Hkv, Sk, D]`` (CUDA) -> ``(q_s, k_s, v_s, decoded)`` of
    ``nvfp4qk_fp8pv``: Q and K NVFP4 (per-head global scale, 16-element E4M3 block scales) with their
    exact BF16 decodes and per-token global scales ``decoded = (s_b * q, s_b * k, g_q, g_k)`` (``g``
    FP32 ``[B, H, S]``), which feed the BF16 QK product (contract §1), and V as in
    :func:`quantize_inputs` (Triton quantizers). With ``rope`` (a ``RoPETables``) those of the RoPE'd
    Q and K, RoPE applied in both passes of the quantizer (``quantize_nvfp4_heads_rope``)."""
    b, hq, _, d = q.shape
    hkv = k.shape[1]
    zq, zk, zv = _words(q, [b * hq, b * hkv, b * hkv * d], fill=True)[1]  # the three amax passes, one fill
    if rope is not None:
        q_s, q_dec, q_tok = quantize_nvfp4_heads_rope(q, rope.cos_q, rope.sin_q, zeroed=zq)
        k_s, k_dec, k_tok = quantize_nvfp4_heads_rope(k, rope.cos_k, rope.sin_k, zeroed=zk)
    else:  # read in place; the global scale formed in the kernels
        q_s, q_dec, q_tok = quantize_nvfp4_heads(q, zeroed=zq)
        k_s, k_dec, k_tok = quantize_nvfp4_heads(k, zeroed=zk)
    return q_s, k_s, quantize_fp8_v_transposed(v, perm16=True, zeroed=zv), (q_dec, k_dec, q_tok, k_tok)


def forward_fp8(
    q8,
    k8,
    vt_perm,
    row,
    col,
    v_scale,
    qk_scale_log2: float,
    *,
    causal: bool,
    tiles=None,
    out_layout_of: torch.Tensor | None = None,
    **kernel_options,
):
    """Run the CuTe ``fp8`` forward on prepared operands.

    Args:
        q8: E4M3 ``[B, Hq, Sq, D]`` contiguous; k8: E4M3 ``[B, Hkv, Sk, D]`` contiguous (BF16 with
            ``qk_bf16=True``: the NVFP4 decode ``s_b * q`` of ``nvfp4qk_fp8pv``).
        vt_perm: E4M3 ``[B, Hkv, D, Sk16]`` in the ``pv_layout`` key order
            (``quantize_fp8_v_transposed(v, perm16=True).data``).
        row: FP32 ``[B, Hq, Sq]``, the Q token scale (NVFP4: the per-head global scale per token).
        col: FP32 ``[B, Hkv, Sk]``, K token scale (NVFP4: global scale, broadcast): positive and
            finite, or NaN only for a key whose K operand is NaN (as the quantizers write them). The
            kernel multiplies the scores by ``col`` before the mask, so a masked score is -inf
            whatever its scale. With ``qk_bf16`` it reads key 0's (the head's global scale), with
            ``k_group`` each group's first key's, and folds it into the row factor instead
            (``fwd_sm90.fold_k_scale``: a NaN scale read as 1, the product floored at 2^-126, so a
            masked -inf stays -inf), as the backward does for ``qk_bf16``;
        v_scale: FP32 ``[B, Hkv, D]``.
        qk_scale_log2: softmax_scale * log2 e (a float): the kernel's row factor of query i is
            ``row[i] * qk_scale_log2`` in FP32.
        tiles: ``(tile_m, tile_n, stages)``, one of ``SUPPORTED_TILES``; default
            :func:`default_tiles` of the head dim.
        out_layout_of: a ``[B, Hq, Sq, D]`` tensor (the caller's BF16 q) whose memory order the
            output takes (``layouts.empty_in_layout_of``); default contiguous.
        kernel_options: ``qk_bf16`` (the nvfp4qk_fp8pv operands), and the measurement option of
            :class:`FP8ForwardSm90` ``k_group=64``, for K quantized per 64 keys by
            ``quantize_fp8_key_groups`` (``col`` must then be constant over each 64 keys, which is
            not checked).
    Returns:
        out BF16 ``[B, Hq, Sq, D]`` and the natural-log LSE FP32 ``[B, Hq, Sq]``.
    Raises:
        ValueError: operands of the wrong dtype, layout or shape, tiles outside ``SUPPORTED_TILES``,
            or a ``k_group`` other than 0 and 64, with NVFP4 Q/K, or at KV tiles
            that are not a multiple of 64 keys.
    """
    tiles = default_tiles(q8.shape[-1]) if tiles is None else tuple(tiles)
    k_group = kernel_options.get("k_group", 0)
    if k_group not in (0, 64) or (k_group and (tiles[1] % k_group or kernel_options.get("qk_bf16", False))):
        raise ValueError(
            f"forward_fp8: k_group must be 0 or 64, with E4M3 Q/K and KV tiles of a multiple of 64 keys; got "
            f"k_group={k_group} at tiles {tiles}; use k_group=0, or one of the tiles "
            f"{[t for t in SUPPORTED_TILES if t[1] % 64 == 0]}"
        )
    _check_operands(q8, k8, vt_perm, row, col, v_scale, tiles, kernel_options.get("qk_bf16", False))
    b, hq, sq, d = q8.shape
    hkv = k8.shape[1]
    if out_layout_of is None or out_layout_of.stride(-1) != 1:
        out = torch.empty((b, hq, sq, d), dtype=torch.bfloat16, device=q8.device)
    else:
        out = empty_in_layout_of(out_layout_of, (b, hq, sq, d))
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q8.device)
    args = (
        q8.permute(0, 2, 1, 3),
        k8.permute(0, 2, 1, 3),
        vt_perm.permute(0, 3, 1, 2),
        out.permute(0, 2, 1, 3),
        lse,
        row,
        col,
        v_scale,
    )
    fn = _compiled(d, hq // hkv, causal, tiles, args, kernel_options)
    fn(*[t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in args], qk_scale_log2)
    return out, lse


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def backward_operands(state: SavedState, dout: torch.Tensor, softmax_scale: float) -> dict:
    """The backward kernel's operands from the forward's :class:`SavedState` and BF16 ``dout``
    ``[B, Hq, Sq, D]``: dO's E5M2 codes in both layouts, D, the per-query vectors padded to a
    multiple of the backward's ``tile_m`` (stat -inf, the others 0) and the BF16 image of the Q
    payload from two Triton kernels (``triton.dout_quant``); the BF16 image of the K payload and V in
    key order from one (``triton.bwd_kv``); the zeroed FP32 accumulators and the dO amax pass's
    zeroed words with torch (one fill).

    ``fp8`` state (E4M3 Q/K): the BF16 operands of dK and dQ carry the token scales, ``qb`` =
    BF16(q8 * row) and ``kb`` = BF16(k8 * col2) (``row``, ``col2``: the Q and K token scales times
    2^-LIFT), as ``reference_backward`` defines the recipe's dQ/dK.
    ``nvfp4qk_fp8pv`` state (NVFP4 Q/K): the BF16 images are the exact decodes ``s_b * q`` (Q by
    ``decode_nvfp4_rows``), the token scales the per-head global scales broadcast per token, and
    ``q8`` / ``k8`` are the BF16 images too (the kernel's ``qk_bf16`` S^T reads only those)."""
    tile_m, tile_n = BWD_TILES
    q_s, k_s, v_s = state.q, state.k, state.v
    nvfp4 = isinstance(q_s, NVFP4Tensor)
    b, hq, sq, d = dout.shape
    hkv, sk = (k_s.shape if nvfp4 else k_s.data.shape)[1:3]
    v_scale = v_s.scale.squeeze(2).contiguous()  # [B, Hkv, D]
    # one fill zeroes the FP32 accumulators the kernel bulk-adds into (dQ's, and for GQA dK's and
    # dV's: contiguous slices whose offsets are multiples of tile_m * d * 4 bytes) and, after them,
    # the dO amax pass's per-head amax and flag (2 * B * Hq words): one launch for both
    dq_shape = (b, hq, _round_up(sq, tile_m) * d)
    kv_shape = (b, hkv, _round_up(sk, tile_n) * d)
    n_dq, n_kv = math.prod(dq_shape), (0 if hq == hkv else math.prod(kv_shape))
    acc = torch.zeros(n_dq + 2 * n_kv + 2 * b * hq, dtype=torch.float32, device=dout.device)
    if nvfp4:  # the per-head scale expanded over the queries: read through its strides, not copied
        q_scale = q_s.global_scale.reshape(b, hq, 1).float().expand(b, hq, sq)
    else:
        q_scale = q_s.scale.squeeze(-1)
    dv = quantize_dout_fused(
        dout,
        state.out,
        v_scale,
        state.lse,
        lift=LIFT,
        pad_to=tile_m,
        transposed=True,
        q_scale=q_scale,
        qk_scale_log2=softmax_scale * LOG2E,
        q8=None if nvfp4 else q_s.data,
        zeroed=acc[n_dq + 2 * n_kv :],
    )
    qb = decode_nvfp4_rows(q_s) if nvfp4 else dv.qb
    kv = backward_kv_operands(k_s, v_s.data, col2_scale=2.0**-LIFT)  # kb, v8, col, col2
    kb = kv["kb"]
    ops = dict(
        q8=qb if nvfp4 else q_s.data,
        qb=qb,
        k8=kb if nvfp4 else k_s.data,
        kb=kb,
        v8=kv["v8"],  # [B, Hkv, Sk, D], key order
        do8=dv.do_q.data,
        dot8=dv.dot,  # [B, Hq, D, Sq16], queries permuted
        stat=dv.stat,
        r=dv.r,
        row=dv.row,
        delta=dv.delta,
        col=kv["col"],  # K token scales (NVFP4: the head's global scale per key)
        col2=kv["col2"],  # col * 2^-LIFT
        s_do=dv.s_do,
        v_scale=v_scale,
    )
    ops["acc"] = acc  # dQ's accumulator, then GQA's dK's and dV's (triton.bwd_post reads them in one)
    ops["dq_accum"] = acc[:n_dq].view(dq_shape)
    if hq == hkv:  # written by the kernel, in the layout of the forward's output (the caller's)
        ops["dk"] = empty_in_layout_of(state.out, (b, hkv, sk, d))
        ops["dv"] = empty_in_layout_of(state.out, (b, hkv, sk, d))
    else:
        ops["dk"] = acc[n_dq : n_dq + n_kv].view(kv_shape)
        ops["dv"] = acc[n_dq + n_kv : n_dq + 2 * n_kv].view(kv_shape)
    return ops


def _bwd_args(ops: dict) -> list:
    """The kernel's arguments in ``FP8BackwardSm90.__call__`` order: (B, S, H, D) views of the
    ``[B, H, S, D]`` tensors, the rest as they are."""
    bshd = [ops[n].permute(0, 2, 1, 3) for n in ("q8", "qb", "k8", "kb", "v8", "do8")]
    args = [*bshd, ops["dot8"].permute(0, 3, 1, 2)]
    args += [ops[n] for n in ("stat", "r", "row", "delta", "col", "col2", "s_do", "v_scale", "dq_accum")]
    mha = ops["dk"].dim() == 4
    args += [ops[n].permute(0, 2, 1, 3) if mha else ops[n] for n in ("dk", "dv")]
    return args


def _compiled_bwd(d: int, group: int, causal: bool, qk_bf16: bool, args: list, softmax_scale: float):
    key = ("bwd", d, group, causal) + (("qk_bf16",) if qk_bf16 else ())
    if key not in _CACHE:
        kernel = FP8BackwardSm90(d, group, causal, *BWD_TILES, qk_bf16=qk_bf16)
        # (B, S, H, D) views with D contiguous; dO^T with S
        cute_args = [cute_operand(t, leading_dim=3) for t in args[:6]]
        cute_args.append(cute_operand(args[6], leading_dim=1))
        cute_args += [cute_operand(t, assumed_align=4, leading_dim=t.dim() - 1) for t in args[7:15]]
        cute_args.append(cute_operand(args[15], leading_dim=2))
        cute_args += [cute_operand(t, leading_dim=t.dim() - 1) for t in args[16:]]
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        t0 = time.perf_counter()
        _CACHE[key] = cute.compile(
            kernel, *cute_args, cutlass.Float32(softmax_scale), stream, options="--enable-tvm-ffi"
        )
        _record_compile(key, time.perf_counter() - t0)
    return _CACHE[key]


def backward_fp8(
    state: SavedState,
    dout: torch.Tensor,
    *,
    causal: bool,
    softmax_scale: float,
    dlse: torch.Tensor | None = None,
):
    """CuTe backward of ``fp8`` and ``nvfp4qk_fp8pv``: ``(dq, dk, dv)`` BF16 ``[B, H, S, D]`` from this
    backend's forward state (V in the kernel's layout) and BF16 ``dout [B, Hq, Sq, D]``; ``dlse``, the
    LSE's gradient (FP32 ``[B, Hq, Sq]`` or None), enters as ``D - dlse`` (``reference_backward``'s
    rule), subtracted from the preprocess's D before the kernel reads it. NVFP4 Q/K
    run the kernel's ``qk_bf16`` S^T (the BF16 wgmma on their exact decodes, as the forward's QK);
    the rest of the loop is the same FP8 one; E4M3 Q/K run one BF16 dS for dQ and dK with the token
    scales in their BF16 operands (``FP8BackwardSm90``, the recipe's definition). The FP32
    accumulators become BF16 in :func:`postprocess_gradients`.

    Raises:
        ValueError: head dim other than 64/128, or a state of another recipe (neither E4M3 nor NVFP4
            Q/K, or V not E4M3).
    """
    b, hq, sq, d = dout.shape
    if d not in (64, 128):
        raise ValueError(f"cute backward: head dim must be 64 or 128, got {d}; use backend='triton'")
    qk_bf16 = isinstance(state.q, NVFP4Tensor) and isinstance(state.k, NVFP4Tensor)
    fp8_qk = isinstance(state.q, FP8Tensor) and state.q.data.dtype == torch.float8_e4m3fn
    if not (qk_bf16 or fp8_qk) or not isinstance(state.v, FP8Tensor):
        raise ValueError(
            "cute backward: needs the saved state of the cute forward of recipe fp8 or nvfp4qk_fp8pv "
            "(E4M3 or NVFP4 Q/K, E4M3 V); for another recipe's state use backend='triton' or 'reference'"
        )
    hkv = (state.k.shape if qk_bf16 else state.k.data.shape)[1]
    ops = backward_operands(state, dout, softmax_scale)  # dout read in place
    if dlse is not None:  # D [B, Hq, S_pad]: the padded rows (stat -inf, P = 0) keep their 0
        ops["delta"][..., :sq].sub_(dlse)
    args = _bwd_args(ops)
    fn = _compiled_bwd(d, hq // hkv, causal, qk_bf16, args, softmax_scale)
    fn(*[t.view(torch.uint8) if t.element_size() == 1 else t for t in args], softmax_scale)
    return postprocess_gradients(ops, state, softmax_scale)


def postprocess_gradients(ops: dict, state: SavedState, softmax_scale: float):
    """The BF16 ``(dq, dk, dv)`` ``[B, H, S, D]`` from the backward kernel's FP32 accumulators in ``ops``
    (:func:`backward_operands`): dQ times ``softmax_scale``, and for GQA dK and dV, in one launch of
    ``triton.bwd_post.convert_accumulators`` (the bytes of FA4's postprocess, one launch per tensor,
    which it replaced: 1% faster at B4 H32/8 S4096 causal on the H200,
    results/session_2026-12-05b_h200); without GQA the kernel wrote dK/dV in BF16 and they are
    returned as they are. The gradients take the memory order of the forward's output (the caller's
    layout): no copy on the way back."""
    tile_m, tile_n = BWD_TILES
    b, hq, sq, d = state.out.shape
    hkv, sk = ops["v8"].shape[1:3]
    dq = empty_in_layout_of(state.out, (b, hq, sq, d))
    if ops["dk"].dim() == 4:  # no GQA: the kernel wrote BF16 dK/dV
        dk = dv = None
    else:  # GQA: FP32 dK/dV accumulators after dQ's in ops["acc"]
        dk, dv = (empty_in_layout_of(state.out, (b, hkv, sk, d)) for _ in range(2))
    convert_accumulators(
        ops["acc"],
        dq,
        dk,
        dv,
        softmax_scale=softmax_scale,
        q_rows=_round_up(sq, tile_m),
        kv_rows=_round_up(sk, tile_n),
    )
    return (dq, ops["dk"], ops["dv"]) if dk is None else (dq, dk, dv)


class CuteBackend:
    """CuTe DSL forward and backward (sm_90, recipes ``fp8`` and ``nvfp4qk_fp8pv``); options ``tiles`` =
    ``(tile_m, tile_n, stages)`` of the forward, for benchmarks, tests and ``tools/fidelity.py``."""

    spec = SPEC

    def forward(
        self,
        q,
        k,
        v,
        recipe: Recipe,
        *,
        causal: bool,
        softmax_scale: float,
        tiles=None,
        rope=None,
    ):
        """BF16 ``q [B, Hq, Sq, D]``, ``k, v [B, Hkv, Sk, D]`` (CUDA, sm_90) -> BF16 out, FP32 natural-log
        LSE ``[B, Hq, Sq]`` and the :class:`SavedState`. Quantizes Q/K (E4M3 per token, K per 64 keys
        with ``recipe.k_scale_keys`` = 64, or NVFP4) and V per channel (Triton quantizers, V into the
        kernel's layout), then runs the kernel (``forward_fp8``; ``k_group`` = 64 for K per 64 keys)
        at ``tiles``, by default :func:`default_tiles`.
        ``rope`` (a ``RoPETables``): attention of the RoPE'd Q/K (:func:`quantize_inputs`).
        Raises ValueError for ``tiles`` outside ``SUPPORTED_TILES``, or KV tiles not a multiple of 64
        keys with ``k_scale_keys`` = 64."""
        if recipe.qk == "nvfp4":
            q_s, k_s, v_s, decoded = quantize_nvfp4_inputs(q, k, v, rope)
        else:
            q_s, k_s, v_s = quantize_inputs(q, k, v, recipe.k_scale_keys, rope)
            decoded = None
        out, lse = forward_fp8(
            *kernel_operands(q_s, k_s, v_s, softmax_scale, decoded),
            causal=causal,
            tiles=tiles,
            out_layout_of=q,  # the output in the caller's layout: no copy on the way back
            qk_bf16=recipe.qk == "nvfp4",
            # K per k_scale_keys keys: the kernel folds each group's scale (k_group); options at
            # their defaults are left out of the compiled-kernel key (forward_key)
            **({"k_group": recipe.k_scale_keys} if recipe.k_scale_keys > 1 else {}),
        )
        return out, lse, SavedState(q=q_s, k=k_s, v=v_s, out=out, lse=lse)

    def backward(
        self,
        state: SavedState,
        dout,
        recipe: Recipe,
        *,
        causal: bool,
        softmax_scale: float,
        tiles=None,
        dlse=None,
    ):
        """The CuTe backward (:func:`backward_fp8`) on this backend's forward state, ``fp8`` and
        ``nvfp4qk_fp8pv``; ``tiles`` is the forward's (the backward runs at ``BWD_TILES``); ``dlse``
        the LSE's gradient or None."""
        return backward_fp8(state, dout, causal=causal, softmax_scale=softmax_scale, dlse=dlse)
