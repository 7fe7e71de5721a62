"""The cute backend's on-disk kernel cache (``cute/compile_cache.py``) without a GPU: a process
compiles the backward kernel for sm_90a and exports it; a second process with the same sources and
target loads it instead of compiling; another target architecture or a changed source gives another
fingerprint, so a stale kernel is never loaded. (Running a loaded kernel
needs the GPU: the cute GPU tests run with the cache set.)

Needs nvidia-cutlass-dsl and flash-attn-4 (the ``cute`` extra, installed by scripts/bootstrap.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json, sys, time
sys.path.insert(0, "bench")
import cute_sass_report  # the DSL's dump options, before cutlass loads
from fp4_attention.backends.cute.compile_cache import make_cache, source_fingerprint

cache = make_cache()
key = ("bwd", 128, 4, True)
compiled = False
t0 = time.perf_counter()
if key not in cache:
    cache[key] = cute_sass_report.compile_bwd(True, 4, 128, seq=256)
    compiled = True
fn = cache[key]
print(json.dumps({"compiled": compiled, "callable": callable(fn), "fingerprint": source_fingerprint(),
                  "seconds": time.perf_counter() - t0}))
"""


def _run(cache_dir: Path, arch: str) -> dict:
    env = {**os.environ, "FP4_ATTENTION_CUTE_CACHE_DIR": str(cache_dir), "CUTE_DSL_ARCH": arch}
    env["PYTHONPATH"] = str(REPO)
    res = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_second_process_loads_the_exported_kernel(tmp_path):
    first = _run(tmp_path, "sm_90a")
    second = _run(tmp_path, "sm_90a")
    assert first["compiled"] and not second["compiled"] and second["callable"], (first, second)
    assert first["fingerprint"] == second["fingerprint"]
    entries = list((tmp_path / first["fingerprint"]).glob("*.o"))
    assert len(entries) == 1 and entries[0].stat().st_size > 0


def test_fingerprint_follows_the_target_and_the_sources(monkeypatch, tmp_path):
    from fp4_attention.backends.cute import compile_cache

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    base = compile_cache.source_fingerprint()
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")
    assert compile_cache.source_fingerprint() != base
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    changed = tmp_path / "bwd_sm90.py"
    changed.write_text("# another kernel source\n")
    monkeypatch.setattr(compile_cache, "_SOURCES", (*compile_cache._SOURCES[:-1], changed))
    assert compile_cache.source_fingerprint() != base


def test_cache_dir_that_is_a_file_is_refused(tmp_path, monkeypatch):
    from fp4_attention.backends.cute.compile_cache import ENV, make_cache

    f = tmp_path / "f"
    f.write_text("x")
    monkeypatch.setenv(ENV, str(f))
    with pytest.raises(ValueError, match="is not a directory; unset it or point it at a directory"):
        make_cache()


def test_fingerprint_follows_the_quack_version(monkeypatch):
    """The kernels trace quack-kernels' helpers (unpinned by flash-attn-4): another version is
    another kernel."""
    from fp4_attention.backends.cute import compile_cache

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    base = compile_cache.source_fingerprint()
    real = compile_cache.importlib.metadata.version
    monkeypatch.setattr(
        compile_cache.importlib.metadata,
        "version",
        lambda dist: "0.0.0-other" if dist == "quack-kernels" else real(dist),
    )
    assert compile_cache.source_fingerprint() != base


def test_cache_dir_that_cannot_be_created_is_refused(tmp_path, monkeypatch):
    from fp4_attention.backends.cute.compile_cache import ENV, make_cache

    f = tmp_path / "f"
    f.write_text("x")
    monkeypatch.setenv(ENV, str(f / "sub"))  # a parent that is a file
    with pytest.raises(
        ValueError, match="cannot create the kernel cache there .*point it at a writable directory"
    ):
        make_cache()
