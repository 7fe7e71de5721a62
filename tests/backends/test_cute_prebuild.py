"""The cute backend's kernels compiled without a GPU (``cute/prebuild.py``,
``tools/prebuild_cute_kernels.py``):

* the descriptors that stand for operands compile to the kernel of the real operands: with the CPU's
  memory space, the forward's SASS of ``to_cute_tensor`` on CPU tensors instruction for instruction;
  with global memory, the forward's and the backward's kernel names are those the H200 compiled
  (``results/``);
* the tool fills a cache that a second run loads; the GPU's target name gives the fingerprint of
  ``CUTE_DSL_ARCH=sm_90a``, so a GPU process finds the kernels a CPU built.

Running a prebuilt kernel needs the GPU (``bench/cute_session.sh`` runs the GPU tests on one).
Needs nvidia-cutlass-dsl and flash-attn-4 (the ``cute`` extra, installed by scripts/bootstrap.sh)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the cute extra)")
if torch.cuda.is_available():  # compiling without a GPU is what these test; tests/conftest.py sets
    pytest.skip("CPU tests of compiling without a GPU", allow_module_level=True)  # the DSL up so only there

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

# the kernel name the H200 gave the fp8 forward (ncu, results/cute_unpromoted_h200/): its FP32 vectors
# in global memory with 64-bit strides
GPU_FORWARD_NAME = "tensorptrf32gmemo1i64i64_t_0"
GPU_BACKWARD_NAME = (
    "FP8BackwardSm90_object_at__tensor0000o11101213_tensor0000o11101213_tensor0000o11101213_"
    "tensor0000o10111213_tensor0000o11101213_tenso_0"
)  # results/cute_bwd_profile_h200/step_profile_cute_fp8_B4_step.json


def _sass(compile_fn) -> tuple[str, list[str]]:
    """The kernel name and instructions (addresses and encodings dropped) of the one cubin that
    ``compile_fn`` leaves in the DSL's dump folder (tests/conftest.py sets it)."""
    from sass_report import disassemble

    dump = Path(os.environ["CUTE_DSL_DUMP_DIR"])
    for old in dump.rglob("*.cubin"):
        old.unlink()
    try:
        compile_fn()
    except Exception as err:  # CPU tensors: the host launcher refuses them after the cubin is written
        if "EnvStream" not in str(err):
            raise
    cubins = list(dump.rglob("*.cubin"))
    assert len(cubins) == 1, cubins
    sass, _ = disassemble(cubins[0])
    lines = [re.sub(r"/\*[^*]*\*/", "", line).strip() for line in sass.splitlines()]
    name = next(line for line in lines if line.startswith("Function :"))
    return name, [line for line in lines if line and not line.startswith("Function :")]


def _fwd_tensors(group=4, d=128, s=256):
    q = torch.zeros(1, 2 * group, s, d, dtype=torch.float8_e4m3fn).permute(0, 2, 1, 3)
    k = torch.zeros(1, 2, s, d, dtype=torch.float8_e4m3fn).permute(0, 2, 1, 3)
    vt = torch.zeros(1, 2, d, s, dtype=torch.float8_e4m3fn).permute(0, 3, 1, 2)
    o = torch.zeros(1, 2 * group, s, d, dtype=torch.bfloat16).permute(0, 2, 1, 3)
    small = [
        torch.zeros(1, 2 * group, s),
        torch.zeros(1, 2 * group, s),
        torch.zeros(1, 2, s),
        torch.zeros(1, 2, d),
    ]
    return [(q, 3, 16), (k, 3, 16), (vt, 1, 16), (o, 3, 16)] + [(t, 2, 4) for t in small]


def _compile(kernel, tensors, convert, *scalars):
    from cutlass import cute

    args = [convert(t, lead, align) for t, lead, align in tensors]
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(kernel, *args, *scalars, stream, options="--enable-tvm-ffi")


def test_forward_descriptors_compile_the_kernel_of_the_real_operands():
    from flash_attn.cute.cute_dsl_utils import to_cute_tensor

    from fp4_attention.backends.cute.arguments import cute_operand
    from fp4_attention.backends.cute.fwd_sm90 import FP8ForwardSm90

    def kernel():
        return FP8ForwardSm90(128, 4, True, tile_m=128, tile_n=192, num_stages=2)

    import cutlass

    tensors = _fwd_tensors()
    qk_scale = cutlass.Float32(1.0)  # the kernel's qk_scale_log2 argument
    name_r, sass_r = _sass(
        lambda: _compile(kernel(), tensors, lambda t, lead, al: to_cute_tensor(t, al, lead), qk_scale)
    )
    name_d, sass_d = _sass(
        lambda: _compile(
            kernel(), tensors, lambda t, lead, al: cute_operand(t, lead, al, device="cpu"), qk_scale
        )
    )
    assert name_d == name_r and sass_d == sass_r
    name_g, _ = _sass(lambda: _compile(kernel(), tensors, cute_operand, qk_scale))
    assert "generic" in name_r and name_g.endswith(GPU_FORWARD_NAME), (name_r, name_g)


@pytest.mark.parametrize("group", [4, 1])
def test_backward_compiles_from_descriptors_to_the_gpus_kernel(group):
    # its TMA bulk copies need global memory: CPU tensors do not compile, so no SASS to compare with;
    # the name (the DSL cuts it) is the one of the H200's fp8 backward. cute_sass_report.compile_bwd
    # compiles it on arguments.cute_operand descriptors in backend._bwd_args's order
    from cute_sass_report import compile_bwd

    name, sass = _sass(lambda: compile_bwd(True, group, 128, seq=256))
    assert name.endswith(GPU_BACKWARD_NAME), name
    assert any(line.startswith("QGMMA") for line in sass)


def test_fp8_operands_take_the_uint8_calling_convention():
    import cutlass

    from fp4_attention.backends.cute.arguments import cute_operand

    for dtype, element, storage in (
        (torch.float8_e4m3fn, cutlass.Float8E4M3FN, "uint8"),
        (torch.float8_e5m2, cutlass.Float8E5M2, "uint8"),
        (torch.bfloat16, cutlass.BFloat16, "bfloat16"),
        (torch.float32, cutlass.Float32, "float32"),
    ):
        desc = cute_operand(torch.zeros(2, 3, dtype=dtype))
        assert desc.element_type is element and str(desc._tvm_ffi_tensor.dtype) == storage
        assert desc._tvm_ffi_tensor.device.type == "cuda"
    with pytest.raises(ValueError, match="no kernel argument of dtype torch.float64"):
        cute_operand(torch.zeros(2, dtype=torch.float64))


def test_fingerprint_follows_the_dsl_compiler_build(monkeypatch):
    # the CUDA 12 and CUDA 13 builds of nvidia-cutlass-dsl 4.8.1 give different SASS: their caches
    # must not be shared
    from fp4_attention.backends.cute import compile_cache

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    flavour, stamp = compile_cache.compiler_dso()
    assert (
        flavour in ("cu12", "cu13")
        and stamp.startswith(f"_cutlass_ir.{flavour}.")
        and len(stamp.split(":")[1]) == 64
    )
    base = compile_cache.source_fingerprint()
    other = "cu13" if flavour == "cu12" else "cu12"
    monkeypatch.setattr(compile_cache, "compiler_dso", lambda: (other, f"_cutlass_ir.{other}.so:" + "0" * 64))
    assert compile_cache.source_fingerprint() != base


def test_gpu_target_name_is_the_prebuilt_one(monkeypatch):
    from fp4_attention.backends.cute import compile_cache

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    prebuilt = compile_cache.source_fingerprint()
    monkeypatch.delenv("CUTE_DSL_ARCH")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert compile_cache._target() == "sm_90a"
    assert compile_cache.source_fingerprint() == prebuilt
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert compile_cache._target() == "sm_89"


_CALL_LOADED = r"""
import torch
from fp4_attention.backends.cute import backend
key = backend.forward_key(128, 4, True, (128, 192, 2), {"qk_bf16": False})  # as CuteBackend.forward asks
assert key in backend._CACHE and not backend.COMPILE_SECONDS  # loaded from the cache, not compiled
print("loaded")
b, hkv, s, d = 1, 2, 256, 128
args = [torch.zeros(b, s, 8, d, dtype=torch.uint8), torch.zeros(b, s, hkv, d, dtype=torch.uint8)]
args += [torch.zeros(b, s, hkv, d, dtype=torch.uint8), torch.zeros(b, s, 8, d, dtype=torch.bfloat16)]
args += [torch.zeros(b, 8, s), torch.zeros(b, 8, s), torch.zeros(b, hkv, s), torch.zeros(b, hkv, d)]
try:
    backend._CACHE[key](*args, 0.1)  # qk_scale_log2
except ValueError as err:
    print(err)
"""


def _tool(cache_dir: Path, *extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUTE_DSL", "FLASH_ATTENTION", "FP4_"))}
    return subprocess.run(
        [sys.executable, "tools/prebuild_cute_kernels.py", "--cache-dir", str(cache_dir), *extra],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_tool_fills_a_cache_that_the_next_run_loads(tmp_path):
    args = ("--groups", "4", "--causal", "yes", "--recipes", "fp8")
    first = _tool(tmp_path, *args)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 kernels (2 compiled, 0 already there) in" in first.stdout, first.stdout
    assert re.search(r"with the DSL's cu1\d compiler", first.stdout), first.stdout
    assert f"export FP4_ATTENTION_CUTE_CACHE_DIR={tmp_path.resolve()}/cute" in first.stdout
    assert "FLASH_ATTENTION" not in first.stdout
    objects = sorted(p.name for p in (tmp_path / "cute").rglob("*.o"))
    assert len(objects) == 2  # fwd, bwd
    second = _tool(tmp_path, *args)
    assert "2 kernels (0 compiled, 2 already there)" in second.stdout, second.stdout + second.stderr
    assert sorted(p.name for p in (tmp_path / "cute").rglob("*.o")) == objects
    # the loaded forward takes what the backend passes on the GPU: E4M3 operands as uint8 views, CUDA
    # tensors (CPU ones are refused by its argument checks, before anything runs)
    child = subprocess.run(
        [sys.executable, "-c", _CALL_LOADED],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "FP4_ATTENTION_CUTE_CACHE_DIR": str(tmp_path / "cute")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stdout + child.stderr
    assert "loaded" in child.stdout and "mQ: Tensor([n0, n1, n2, n3], uint8)" in child.stdout, child.stdout
    assert "expected device_type=cuda" in child.stdout, child.stdout
    bad = _tool(tmp_path, "--tiles", "64,64,2")
    assert bad.returncode == 2 and "--tiles: the backend takes" in bad.stderr
    both = _tool(tmp_path, "--preset", "bench", "--groups", "4")
    assert both.returncode == 2 and "--preset names every kernel itself: leave out --groups" in both.stderr
    missing = _tool(tmp_path, "--dsl-bundle", str(tmp_path / "no-bundle"))
    assert missing.returncode == 2 and "has no install.sh" in missing.stderr, missing.stderr


def test_archive_holds_this_builds_kernels_and_their_locks(tmp_path):
    # a stale fingerprint's folder is left out; the lock files go with the kernels (a reader takes
    # a shared lock on each, so a read-only copy of the cache loads)
    (tmp_path / "cute" / "0123456789abcdef").mkdir(parents=True)
    (tmp_path / "cute" / "0123456789abcdef" / "stale.o").write_bytes(b"x")
    archive = tmp_path / "k.tar.xz"
    res = _tool(tmp_path, "--groups", "4", "--causal", "yes", "--recipes", "fp8", "--archive", str(archive))
    assert res.returncode == 0, res.stdout + res.stderr
    import tarfile

    names = tarfile.open(archive).getnames()
    assert not any("stale" in n for n in names)
    assert sum(n.endswith(".o") for n in names) == 2 and sum(n.endswith(".lock") for n in names) >= 2, names


def test_session_presets_name_the_backends_kernels():
    from fp4_attention.backends.cute.backend import SUPPORTED_TILES, default_tiles
    from fp4_attention.backends.cute.prebuild import KernelKey, preset_keys

    keys = preset_keys("tests")
    fwd = [k for k in keys if k.kind == "fwd"]
    assert {k.tiles for k in fwd} <= set(SUPPORTED_TILES)
    assert len(keys) == len(set(keys))
    # forward: 2 head dims x 3 groups x 2 masks x (2 recipes x 2 tiles + fp8 K per 64 keys x 2 tiles);
    # small_gpu.yaml's head dim 64 GQA 3 causal, both recipes; the 128x64 and 128x96 tiles (2 head
    # dims x GQA 4 x 2 masks x (2 recipes x 2 tiles + K per 64 keys at 128x64)); GQA 2 at D128
    # non-causal (2 recipes x 2 tiles); the training tests' head dim 64 GQA 2 causal fp8. Backward:
    # each (head dim, group, mask, recipe) once
    assert len(fwd) == 2 * 3 * 2 * 6 + 2 + 2 * 2 * 5 + 4 + 1
    assert sum(k.kind == "bwd" for k in keys) == 2 * 3 * 2 * 2 + 2 + 2 + 1
    assert {k.kind for k in keys} == {"fwd", "bwd"}
    assert KernelKey("fwd", 64, 3, True, default_tiles(64), True) in keys
    assert KernelKey("bwd", 64, 2, True) in keys and KernelKey("fwd", 64, 2, True, default_tiles(64)) in keys
    bench = preset_keys("bench")
    assert json.dumps(sorted({(k.kind, k.d) for k in bench})) == json.dumps([["bwd", 128], ["fwd", 128]])


def test_compile_log_lists_the_kernels_compiled(tmp_path, monkeypatch):
    from fp4_attention.backends.cute import backend

    log = tmp_path / "compile_log.jsonl"
    monkeypatch.setattr(backend, "COMPILE_SECONDS", {})
    backend._record_compile(("bwd", 128, 4, True), 2.345)  # without the variable: no file
    assert not log.exists() and backend.COMPILE_SECONDS == {("bwd", 128, 4, True): 2.345}
    monkeypatch.setenv("FP4_ATTENTION_CUTE_COMPILE_LOG", str(log))
    backend._record_compile(("bwd", 128, 4, True), 2.345)
    backend._record_compile((128, 1, False, (128, 192, 2), ()), 1.0)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines == [
        {"key": "('bwd', 128, 4, True)", "seconds": 2.35},
        {"key": "(128, 1, False, (128, 192, 2), ())", "seconds": 1.0},
    ]


@pytest.mark.parametrize("recipe_name", ["fp8", "fp8+k64", "nvfp4qk_fp8pv"])
def test_prebuilt_forward_keys_are_the_backends(recipe_name, monkeypatch):
    # CuteBackend.forward's kernel options, captured before any GPU work, give the cache key of the
    # prebuilt kernel (an fp8 key once differed: qk_bf16=False against nothing)
    from fp4_attention.backends.cute import backend
    from fp4_attention.backends.cute.prebuild import KernelKey, forward_options
    from fp4_attention.numerics.recipes import get_recipe, with_k_scale_keys

    recipe = with_k_scale_keys("fp8", 64) if recipe_name == "fp8+k64" else get_recipe(recipe_name)
    seen = {}
    monkeypatch.setattr(backend, "quantize_inputs", lambda *a: (None, None, None))
    monkeypatch.setattr(backend, "quantize_nvfp4_inputs", lambda *a: (None, None, None, None))
    monkeypatch.setattr(backend, "kernel_operands", lambda *a: ())
    monkeypatch.setattr(backend, "forward_fp8", lambda *a, **kw: seen.update(kw) or (None, None))
    q = torch.zeros(1, 8, 16, 128)
    backend.CuteBackend().forward(q, q[:, :2], q[:, :2], recipe, causal=True, softmax_scale=0.1)
    options = {k: v for k, v in seen.items() if k not in ("causal", "tiles", "out_layout_of")}
    tiles = backend.default_tiles(128)
    key = KernelKey(
        "fwd",
        128,
        4,
        True,
        tiles,
        recipe.qk == "nvfp4",
        recipe.k_scale_keys if recipe.k_scale_keys > 1 else 0,
    )
    assert backend.forward_key(128, 4, True, tiles, options) == backend.forward_key(
        128, 4, True, tiles, forward_options(key)
    )
    assert backend.forward_key(128, 4, True, tiles, {"qk_bf16": False, "k_group": 0}) == (
        128,
        4,
        True,
        tiles,
        (),
    )
