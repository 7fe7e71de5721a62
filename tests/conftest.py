"""Shared helpers for the attention tests (CPU and GPU)."""

import atexit
import importlib.util
import os
import shutil
import tempfile

import pytest
import torch

# The CUTLASS DSL reads these when it is first imported, by whichever test imports it first. On a
# machine without a GPU it then compiles the CuTe kernels for Hopper and keeps their cubin, which
# tests/test_cute_sass.py disassembles (bench/cute_sass_report.py).
if not torch.cuda.is_available():
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.setdefault("CUTE_DSL_KEEP", "cubin")
    if "CUTE_DSL_DUMP_DIR" not in os.environ:
        os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="cute_dsl_")
        atexit.register(shutil.rmtree, os.environ["CUTE_DSL_DUMP_DIR"], ignore_errors=True)


def have_module(name: str) -> bool:
    """Whether ``name`` is importable, without importing it (``find_spec`` of a submodule imports its
    parent package, which may be another distribution of the same name: False then)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-300))


def cosine(x: torch.Tensor, ref: torch.Tensor) -> float:
    a, b = x.detach().double().cpu().flatten(), ref.detach().double().cpu().flatten()
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))


def make_qkv(b, hq, hkv, sq, sk, d, *, seed=0, scale=1.0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, hq, sq, d, generator=g) * scale).bfloat16()
    k = (torch.randn(b, hkv, sk, d, generator=g) * scale).bfloat16()
    v = torch.randn(b, hkv, sk, d, generator=g).bfloat16()
    return q.to(device), k.to(device), v.to(device)


@pytest.fixture
def qkv_factory():
    return make_qkv
