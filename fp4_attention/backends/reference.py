"""The ``reference`` backend: the torch reference (``numerics.reference``) behind the backend
protocol. Every recipe, any device, slow; the definition every GPU backend is tested against."""

from __future__ import annotations

from ..numerics.reference import DEFAULT_BLOCK_N, reference_backward, reference_forward
from .base import BackendSpec, SavedState
from .layouts import empty_in_layout_of

__all__ = ["SPEC", "ReferenceBackend"]

SPEC = BackendSpec(
    name="reference",
    impl="fp4_attention.backends.reference:ReferenceBackend",
    recipes=("bf16", "fp8", "nvfp4qk_fp8pv", "nvfp4qk_mxfp4pv_fast", "nvfp4qk_mxfp4pv_accurate"),
    devices=("cpu", "cuda"),
    options=("block_n", "rescale_threshold"),
    qk_rotations=("hadamard",),
    k_scale_keys=(1, 64),
    lse_grad=True,
    priority=0,
    summary="plain torch, tiled like the kernels; defines the numerics of every recipe",
)


class ReferenceBackend:
    """Options: ``block_n`` (keys per tile, default 128), ``rescale_threshold`` (lazy rescaling,
    log2 units, default 0; forward only)."""

    spec = SPEC

    def forward(
        self, q, k, v, recipe, *, causal, softmax_scale, block_n=DEFAULT_BLOCK_N, rescale_threshold=0.0
    ):
        out, lse, state = reference_forward(
            q,
            k,
            v,
            recipe,
            causal=causal,
            softmax_scale=softmax_scale,
            block_n=block_n,
            rescale_threshold=rescale_threshold,
        )
        # the output in the caller's memory order, as the GPU backends allocate it (found in review,
        # 2026-12-06: the [B, H, S, D] result, permuted back to bshd, failed out.view(B, S, -1))
        placed = empty_in_layout_of(q, out.shape, out.dtype)
        if placed.stride() != out.stride():
            out = placed.copy_(out)
        return out, lse, state

    def backward(
        self,
        state: SavedState,
        dout,
        recipe,
        *,
        causal,
        softmax_scale,
        block_n=DEFAULT_BLOCK_N,
        rescale_threshold=0.0,
        dlse=None,
    ):
        return reference_backward(
            state,
            dout.contiguous(),
            recipe,
            causal=causal,
            softmax_scale=softmax_scale,
            block_n=block_n,
            dlse=dlse,
        )
