"""Host side of the ``cute`` and ``fa4`` backends on a CPU: they import, and refuse what they cannot
run with errors that name the alternative. Needs the cute extra (bootstrap installs it): a missing
DSL fails these tests."""

import pytest
import torch

import fp4_attention as fa
from fp4_attention.backends.cute import backend as cute_backend


def _qkv(d=128):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, h, 64, d, generator=g).bfloat16() for h in (4, 1, 1)]


def test_backends_import_lazily():
    assert fa.get_backend("cute").spec.name == "cute"
    assert fa.get_backend("fa4").spec.name == "fa4"


def test_cpu_tensors_name_the_reference_backend():
    q, k, v = _qkv()
    for backend, recipe in (("cute", "fp8"), ("fa4", "bf16")):
        with pytest.raises(fa.UnsupportedError, match="backend='reference'"):
            fa.attention(q, k, v, recipe=recipe, backend=backend, layout="bhsd")


def test_fa4_names_the_backend_for_other_recipes():
    q, k, v = _qkv()
    with pytest.raises(fa.UnsupportedError, match="runs recipes bf16, not 'fp8'; use backend='reference'"):
        fa.attention(q, k, v, recipe="fp8", backend="fa4", layout="bhsd")
    with pytest.raises(fa.UnsupportedError, match="runs recipes bf16, not 'nvfp4qk_fp8pv'"):
        fa.attention(q, k, v, recipe="nvfp4qk_fp8pv", backend="fa4", layout="bhsd")


def test_forward_fp8_rejects_unsupported_tiles_and_bad_operands():
    q8 = torch.zeros(1, 4, 64, 128, dtype=torch.float8_e4m3fn)
    k8 = torch.zeros(1, 1, 64, 128, dtype=torch.float8_e4m3fn)
    vt = torch.zeros(1, 1, 128, 64, dtype=torch.float8_e4m3fn)
    row, col, vs = torch.ones(1, 4, 64), torch.ones(1, 1, 64), torch.ones(1, 1, 128)
    with pytest.raises(ValueError, match="tiles .* not supported; use one of"):
        cute_backend.forward_fp8(q8, k8, vt, row, col, vs, 0.1, causal=True, tiles=(64, 64, 2))
    with pytest.raises(ValueError, match="q8 must be a CUDA"):  # CPU tensors
        cute_backend.forward_fp8(q8, k8, vt, row, col, vs, 0.1, causal=True)
    # the k_group option: one K scale per 64 keys needs KV tiles of a multiple of 64 and E4M3 Q/K
    for tiles, opts in (((128, 96, 2), {"k_group": 64}), ((128, 128, 2), {"k_group": 32})):
        with pytest.raises(ValueError, match=r"k_group must be 0 or 64.*one of the tiles \[\(128, 128, 2\)"):
            cute_backend.forward_fp8(q8, k8, vt, row, col, vs, 0.1, causal=True, tiles=tiles, **opts)
    with pytest.raises(ValueError, match="k_group must be 0 or 64, with E4M3 Q/K"):
        cute_backend.forward_fp8(q8, k8, vt, row, col, vs, 0.1, causal=True, k_group=64, qk_bf16=True)


def test_default_tiles_follow_the_measurement():
    """The forward's tiles when none are given: 192 keys at D128 (the faster on the H200, causal or
    not), 128 at D64; both supported; the losing 160-key, three-stage and 192-row tiles are refused."""
    assert cute_backend.default_tiles(128) == cute_backend.D128_TILES == (128, 192, 2)
    assert cute_backend.default_tiles(64) == cute_backend.DEFAULT_TILES == (128, 128, 2)
    assert {cute_backend.DEFAULT_TILES, cute_backend.D128_TILES} <= set(cute_backend.SUPPORTED_TILES)
    q8 = torch.zeros(1, 4, 64, 128, dtype=torch.float8_e4m3fn)
    args = (q8, q8[:, :1], torch.zeros(1, 1, 128, 64, dtype=torch.float8_e4m3fn), *[torch.ones(1)] * 3, 0.1)
    for tiles in ((128, 160, 2), (128, 128, 3), (128, 160, 3), (192, 64, 2)):
        with pytest.raises(ValueError, match="not supported"):
            cute_backend.forward_fp8(*args, causal=True, tiles=tiles)


def test_cute_profile_says_what_is_wrong():
    """bench/cute_profile.py (run under Nsight Compute on the GPU machine) names a malformed shape or
    tile argument, and the missing GPU, instead of a traceback."""
    import subprocess
    import sys
    from functools import partial
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "bench" / "cute_profile.py"
    run = partial(subprocess.run, check=False, capture_output=True, text=True, timeout=120)
    for args, msg in (
        (["--shape", "2,32"], "--shape B,Hq,Hkv,S must be 4 positive integers"),
        (["--tiles", "128,x,2"], "--tiles tile_m,tile_n,stages must be 3 positive integers"),
    ):
        res = run([sys.executable, str(script), *args])
        assert res.returncode != 0 and msg in res.stderr, res.stderr
    if not torch.cuda.is_available():
        res = run([sys.executable, str(script)])
        assert res.returncode != 0 and "needs a CUDA GPU" in res.stderr, res.stderr


def test_zeroed_words_of_a_forward_are_one_fill_aligned_parts():
    """The forward's amax words (NVFP4 Q, K, V): one zero fill split into parts of ``2 n`` words, each
    starting on a 16-byte boundary (Triton specializes on a pointer's alignment), none overlapping."""
    from tests.dispatch_ops import FILL_OPS, OpNames

    with OpNames() as ops:
        parts = cute_backend._words(torch.empty(1), [1 * 4, 1 * 1, 1 * 1 * 128], fill=True)[1]
    assert [op for op in ops.names if op in FILL_OPS] == ["zeros"]
    assert [p.numel() for p in parts] == [8, 2, 256]
    offsets = [p.storage_offset() for p in parts]
    assert all(o % 4 == 0 for o in offsets) and offsets == sorted(offsets)
    assert all(a + p.numel() <= b for p, a, b in zip(parts, offsets, offsets[1:]))
    assert all(p.is_contiguous() and p.dtype == torch.float32 and not p.any() for p in parts)
