"""Shared helpers for the attention tests (CPU and GPU).

Side effect on a machine without CUDA: sets the CUTLASS DSL's ``CUTE_DSL_ARCH`` / ``CUTE_DSL_KEEP``
/ ``CUTE_DSL_DUMP_DIR`` for the whole session (where not already set; the dump folder is removed at
exit), so the CuTe kernels compile for sm_90a and keep their cubin (tests/backends/test_cute_sass.py).
"""

import atexit
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

# The CUTLASS DSL reads these when it is first imported, by whichever test imports it first. On a
# machine without a GPU it then compiles the CuTe kernels for Hopper and keeps their cubin, which
# tests/backends/test_cute_sass.py disassembles (bench/cute_sass_report.py).
# The dump folder is one per process: pytest-xdist's workers inherit the environment of the
# controller, which loads this file too, and two workers compiling into one folder find each other's
# cubins (bench/cute_sass_report.py expects exactly one). _DUMP_OWNER marks a folder made here, with
# the pid that made it; a folder set by the user (no mark) is kept.
_DUMP_OWNER = "FP4_ATTENTION_TEST_DUMP_DIR_PID"
if not torch.cuda.is_available():
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.setdefault("CUTE_DSL_KEEP", "cubin")
    if "CUTE_DSL_DUMP_DIR" not in os.environ or os.environ.get(_DUMP_OWNER, str(os.getpid())) != str(
        os.getpid()
    ):
        os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="cute_dsl_")
        os.environ[_DUMP_OWNER] = str(os.getpid())
        atexit.register(shutil.rmtree, os.environ["CUTE_DSL_DUMP_DIR"], ignore_errors=True)


def run_interpreted(test_file: str, *args: str) -> None:
    """Run ``test_file`` as a script (with ``args``) under ``TRITON_INTERPRET=1`` (the variable is
    read when the kernels are defined, so in a fresh process) and assert that it exited 0 and printed
    ``ok`` last (its ``__main__`` block prints the failed checks otherwise)."""
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(repo)}
    res = subprocess.run(
        [sys.executable, test_file, *args], env=env, cwd=repo, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().splitlines()[-1] == "ok", res.stdout + res.stderr


def have_module(name: str) -> bool:
    """Whether ``name`` can be found by the import system, without importing ``name`` itself. For a
    dotted name, ``find_spec`` imports the parent packages; if one of them fails to import (say,
    another distribution of the same name) the answer is False."""
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


class ReferenceBacked:
    """A test backend declared by ``spec`` that computes the reference backend's forward and backward
    (for registry rules: priorities, deterministic mode). Register with ``fa.register_backend``."""

    def __init__(self, spec):
        self.spec = spec

    def forward(self, q, k, v, recipe, *, causal, softmax_scale):
        import fp4_attention as fa

        return fa.get_backend("reference").forward(
            q, k, v, recipe, causal=causal, softmax_scale=softmax_scale
        )

    def backward(self, state, dout, recipe, *, causal, softmax_scale):
        import fp4_attention as fa

        return fa.get_backend("reference").backward(
            state, dout, recipe, causal=causal, softmax_scale=softmax_scale
        )


def atomic_fp8_backend(name: str) -> ReferenceBacked:
    """A CPU backend ``name`` ranked above the reference (priority 99) whose fp8 backward is declared
    not bitwise reproducible (``nondeterministic``, as cute's on a GPU); it computes the reference's."""
    from fp4_attention.backends import BackendSpec

    return ReferenceBacked(
        BackendSpec(
            name=name,
            impl="unused:Unused",
            recipes=("fp8",),
            devices=("cpu",),
            priority=99,
            nondeterministic=("fp8",),
        )
    )


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-300))


def cosine(x: torch.Tensor, ref: torch.Tensor) -> float:
    a, b = x.detach().double().cpu().flatten(), ref.detach().double().cpu().flatten()
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-300))


def make_qkv(b, hq, hkv, sq, sk, d, *, seed=0, scale=1.0, device="cpu"):
    """BF16 Q ``[b, hq, sq, d]``, K and V ``[b, hkv, sk, d]`` drawn N(0, 1) from ``seed``; ``scale``
    multiplies Q and K only (wider logits, scale^2 times the score spread), not V."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, hq, sq, d, generator=g) * scale).bfloat16()
    k = (torch.randn(b, hkv, sk, d, generator=g) * scale).bfloat16()
    v = torch.randn(b, hkv, sk, d, generator=g).bfloat16()
    return q.to(device), k.to(device), v.to(device)


@pytest.fixture
def qkv_factory():
    return make_qkv
