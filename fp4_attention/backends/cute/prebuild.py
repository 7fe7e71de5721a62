"""The cute backend's kernels compiled without a GPU, into the on-disk kernel cache
(``compile_cache.py``), so that the processes of a job load them instead of compiling them: build
the cache once on a CPU machine (a login node), then run with ``FP4_ATTENTION_CUTE_CACHE_DIR``
pointing at it (``tools/prebuild_cute_kernels.py``).

How: the CUTLASS DSL compiles a kernel for a target named by ``CUTE_DSL_ARCH`` (``sm_90a``) from
descriptors of its tensor arguments; no tensor memory is touched. The backend's compile functions
take their arguments through ``arguments.cute_operand``, which turns a CPU tensor into the
descriptor of a CUDA tensor of the same dtype and rank; this module calls those functions on CPU
stand-ins.

Checked without a GPU (``tests/backends/test_cute_prebuild.py``): with the CPU's own memory space
instead of global memory, the descriptors give the forward's SASS of ``to_cute_tensor`` on CPU
tensors instruction for instruction (the backward's bulk copies need global memory, so CPU tensors
do not compile it); with global memory, the forward's and the backward's kernel names are those of
the H200's compiles (``results/``), and a loaded kernel's argument checks ask for CUDA tensors with
E4M3 as ``uint8``. Whether the loaded kernels run on the H200 is for its GPU tests to show
(``bench/cute_session.sh``).

Compile with the DSL build the GPU runs: nvidia-cutlass-dsl 4.8.1 comes with a CUDA 12 and a CUDA 13
build of its compiler, which give different SASS for the same kernel; the cache's fingerprint tells
them apart (``compile_cache.compiler_dso``), and ``tools/prebuild_cute_kernels.py --dsl-bundle``
compiles with the GPU bundle's.

The calling-convention part sets a private attribute of the DSL's fake tensor
(``_tvm_ffi_tensor``, read by ``cute/_tvm_ffi_args_spec_converter.py`` and ``cute/metadata.py`` of
nvidia-cutlass-dsl 4.8); the cache's fingerprint includes the DSL's version, so another version
never loads these kernels unchecked.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass

import torch

__all__ = ["KernelKey", "SESSION_PRESETS", "keys_for", "prebuild", "preset_keys"]


@dataclass(frozen=True)
class KernelKey:
    """One compiled kernel of the cute backend: ``kind`` ``"fwd"`` (``FP8ForwardSm90`` at ``tiles``,
    with ``k_group``) or ``"bwd"`` (``FP8BackwardSm90``); ``qk_bf16``: the ``nvfp4qk_fp8pv``
    kernels."""

    kind: str
    d: int
    group: int = 1
    causal: bool = False
    tiles: tuple = ()
    qk_bf16: bool = False
    k_group: int = 0


def _empty(*shape_dtype):
    return [torch.empty((1,) * ndim, dtype=dtype) for ndim, dtype in shape_dtype]


def _forward(key: KernelKey):
    """The backend's own compile function, on CPU stand-ins of its operands (dtype and rank)."""
    from . import backend

    qk = torch.bfloat16 if key.qk_bf16 else torch.float8_e4m3fn
    args = _empty((4, qk), (4, qk), (4, torch.float8_e4m3fn), (4, torch.bfloat16), *[(3, torch.float32)] * 4)
    return backend._compiled(key.d, key.group, key.causal, tuple(key.tiles), args, forward_options(key))


def forward_options(key: KernelKey) -> dict:
    """The ``FP8ForwardSm90`` options of a ``"fwd"`` key, as ``CuteBackend.forward`` passes them
    (``backend.forward_key`` leaves those at their defaults out of the cache key)."""
    return {"qk_bf16": key.qk_bf16, **({"k_group": key.k_group} if key.k_group else {})}


def _backward(key: KernelKey):
    from . import backend

    qk = torch.bfloat16 if key.qk_bf16 else torch.float8_e4m3fn
    bf, f32, e4, e5 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2
    # _bwd_args's order: q8, qb, k8, kb, v8, do8 (B, S, H, D); dO^T; stat, r, row, delta (B, Hq, Sq);
    # col, col2 (B, Hkv, Sk); s_do (B, Hq); v_scale (B, Hkv, D); dq_accum (B, Hq, Sq_pad * D); dk, dv
    args = _empty((4, qk), (4, bf), (4, qk), (4, bf), (4, e4), (4, e5), (4, e5), *[(3, f32)] * 6, (2, f32))
    args += _empty((3, f32), (3, f32))
    args += _empty((4, bf), (4, bf)) if key.group == 1 else _empty((3, f32), (3, f32))
    return backend._compiled_bwd(key.d, key.group, key.causal, key.qk_bf16, args, 1.0)


def keys_for(
    head_dims=(128,),
    groups=(1, 4),
    causal=(False, True),
    tiles=None,
    recipes=("fp8", "nvfp4qk_fp8pv"),
    k_group=False,
) -> list[KernelKey]:
    """Every forward and backward kernel of the cute backend for these head dims, GQA
    groups, masks and recipes, the forward at ``tiles`` (default: the backend's
    ``default_tiles(d)``; a list of ``(tile_m, tile_n, stages)``), with ``k_group``: also the fp8
    forward with K per 64 keys at those tiles whose KV tile is a multiple of 64."""
    from .backend import default_tiles

    keys = []
    for d in head_dims:
        for group, c, recipe in itertools.product(groups, causal, recipes):
            bf16 = recipe == "nvfp4qk_fp8pv"
            for t in tiles or [default_tiles(d)]:
                keys.append(KernelKey("fwd", d, group, c, tuple(t), bf16))
                if k_group and not bf16 and t[1] % 64 == 0:
                    keys.append(KernelKey("fwd", d, group, c, tuple(t), False, 64))
            keys.append(KernelKey("bwd", d, group, c, qk_bf16=bf16))
    return list(dict.fromkeys(keys))


# what a device session compiles (keys_for arguments, one dict per group of keys): "bench",
# bench/attention_bench.py's shapes (D128, GQA 4 causal and MHA non-causal, both recipes, the
# backend's tiles); "tests", the GPU tests' main matrix (head dims 64/128, GQA 1/4/6, both masks,
# both recipes, at both D128 defaults), configs/small_gpu.yaml's model (the train step: head dim
# 64, GQA 3, causal) and the rest of what the GPU tests compile
SESSION_PRESETS = {
    "bench": [dict(head_dims=(128,), groups=(1, 4))],
    "tests": [
        dict(head_dims=(64, 128), groups=(1, 4, 6), tiles=[(128, 128, 2), (128, 192, 2)], k_group=True),
        dict(head_dims=(64,), groups=(3,), causal=(True,)),
        # what the session of 2026-12-05 still compiled on the GPU (its compile_log.jsonl): the other
        # tiles of test_other_tiles_match_reference, and GQA 2 at D128 non-causal
        dict(head_dims=(64, 128), groups=(4,), tiles=[(128, 64, 2), (128, 96, 2)], k_group=True),
        dict(head_dims=(128,), groups=(2,), causal=(False,), tiles=[(128, 128, 2), (128, 192, 2)]),
        # the training GPU tests' model (head dim 64, GQA 2, causal, fp8), which the session of
        # 2026-12-06 still compiled on the GPU (its compile_log.jsonl)
        dict(head_dims=(64,), groups=(2,), causal=(True,), recipes=("fp8",)),
    ],
}


def preset_keys(name: str) -> list[KernelKey]:
    """The keys of :data:`SESSION_PRESETS` ``name``, each once."""
    return list(dict.fromkeys(k for kwargs in SESSION_PRESETS[name] for k in keys_for(**kwargs)))


def prebuild(keys: list[KernelKey], log=print) -> dict:
    """Compile ``keys`` for ``CUTE_DSL_ARCH`` (which must be set: no GPU is asked), each into the
    cute backend's cache (``FP4_ATTENTION_CUTE_CACHE_DIR``); a key already there is loaded, not
    compiled. Returns ``{"compiled": n, "loaded": n, "seconds": s}``.

    Raises:
        ValueError: ``CUTE_DSL_ARCH`` or one of the cache directories unset (the kernels would be
            compiled for nothing).
    """
    for var in ("CUTE_DSL_ARCH", "FP4_ATTENTION_CUTE_CACHE_DIR"):
        if not os.environ.get(var):
            raise ValueError(f"prebuild: set {var} (tools/prebuild_cute_kernels.py sets both)")
    from . import backend

    counts = {"compiled": 0, "loaded": 0, "seconds": 0.0}
    t0 = time.perf_counter()
    for key in keys:
        before = len(backend.COMPILE_SECONDS)
        t = time.perf_counter()
        {"fwd": _forward, "bwd": _backward}[key.kind](key)
        done = "compiled" if len(backend.COMPILE_SECONDS) > before else "loaded"
        counts[done] += 1
        log(f"{done:11s} {key} {time.perf_counter() - t:.1f} s")
    counts["seconds"] = time.perf_counter() - t0
    return counts
