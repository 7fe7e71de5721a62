"""The ``cute`` backend's host path on a CPU: the Python work of one training step's
``CuteBackend.forward`` and ``backward`` with every kernel launch replaced by a counter.

    python bench/host_path_cpu.py [--recipes fp8 nvfp4qk_fp8pv] [--steps 3000] [--out PREFIX]

At B1 the eager cute step is bound by the host (``results/host_launch_cache_h200``: 1.73 ms eager
against 1.04 graphed), so the length of the backend's Python path is what the B1 rows of the
attention benchmark measure. Its launches need a GPU; the rest of it (argument checks, allocations,
views, the launch arguments, the saved state) runs here on CPU tensors, with the Triton kernels'
launches (``triton.launch.CachedLaunch``), the CuTe kernels' calls (``backend._compiled``,
``_compiled_bwd``) counted instead of run.
``backend._check_operands`` is skipped (it requires CUDA tensors), so its time is not in the rows.
``TRITON_INTERPRET=1`` is set before Triton is imported (the Triton wrappers then take CPU tensors,
as in the CPU tests); the interpreted kernels' ``run`` is what is counted.

Per recipe, B1 Hq2/Hkv1 S128 D128 causal (the host benchmarks' shape): the median microseconds of
the forward, the backward and both over ``--steps`` steps (after 200 warm ones; time on this CPU,
which is not the GPU machine's host: compare rows of one run), the kernel launches of a step by
kernel (the torch ops that launch a kernel on a GPU, fills and elementwise ops, included in the
total), the aten ops by name (on a GPU each ``empty`` is a caching-allocator call) and the Python
function calls (``sys.setprofile``). The counts do not depend on the
machine: ``tests/bench/test_host_path_cpu.py`` pins the launches.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime as _dt  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPE = (1, 2, 1, 128, 128)  # B, Hq, Hkv, S, D


@contextlib.contextmanager
def stubbed_launches(launches: Counter, uncached: Counter | None = None):
    """Every kernel launch of the cute backend's step counted in ``launches`` (by kernel) instead of
    run: the Triton kernels' (interpreted, ``InterpretedFunction.run``) and the CuTe kernels'; those
    Triton launches that do not go through ``triton.launch.launcher`` (whose
    cached launch skips ``JITFunction``'s argument binding on a GPU) also in ``uncached``.
    ``backend._check_operands`` is skipped. Puts everything back on exit."""
    from triton.runtime.interpreter import InterpretedFunction

    from fp4_attention.backends.cute import backend as cb
    from fp4_attention.backends.triton import launch

    through_launcher = []
    cached_launch = launch.CachedLaunch.launch

    def counted_cached_launch(self, grid, args, kwargs):
        through_launcher.append(True)
        try:
            return cached_launch(self, grid, args, kwargs)
        finally:
            through_launcher.pop()

    def triton_run(self, *args, grid, warmup, **kwargs):
        name = self.fn.__name__
        launches[name] += 1
        if uncached is not None and not through_launcher:
            uncached[name] += 1

    def cute_fn(name):
        def fn(*args, **kwargs):
            launches[name] += 1

        return lambda *args, **kwargs: fn

    saved = [
        (InterpretedFunction, "run", triton_run),
        (launch.CachedLaunch, "launch", counted_cached_launch),
        (cb, "_compiled", cute_fn("FP8ForwardSm90")),
        (cb, "_compiled_bwd", cute_fn("FP8BackwardSm90")),
        (cb, "_check_operands", lambda *a, **k: None),
    ]
    old = [(owner, name, getattr(owner, name)) for owner, name, _ in saved]
    try:
        for owner, name, new in saved:
            setattr(owner, name, new)
        yield
    finally:
        for owner, name, fn in old:
            setattr(owner, name, fn)


# aten ops that only make a tensor's metadata or take memory: no kernel on a GPU (every other aten op
# of the step is a launch there: a fill, an elementwise op, a copy)
NO_KERNEL_OPS = frozenset(
    "empty empty_like empty_strided view _unsafe_view reshape detach alias permute transpose t slice select "
    "squeeze unsqueeze expand as_strided unbind split split_with_sizes narrow diagonal".split()
)


class _AtenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def _inputs():
    b, hq, hkv, s, d = SHAPE
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, h, s, d, generator=g).bfloat16() for h in (hq, hkv, hkv, hq)]


def step_fns(recipe: str):
    """``(forward, backward)`` of one step on CPU tensors: ``forward()`` returns the saved state."""
    from fp4_attention.backends.cute import backend as cb
    from fp4_attention.numerics.recipes import get_recipe

    be, rec = cb.CuteBackend(), get_recipe(recipe)
    q, k, v, dout = _inputs()
    sm = SHAPE[-1] ** -0.5

    def forward():
        return be.forward(q, k, v, rec, causal=True, softmax_scale=sm)[2]

    def backward(state):
        return be.backward(state, dout, rec, causal=True, softmax_scale=sm)

    return forward, backward


def count_step(recipe: str) -> dict:
    """Launches by kernel, aten ops by name and Python calls of one step (forward and backward)."""
    launches: Counter = Counter()
    uncached: Counter = Counter()
    with stubbed_launches(launches, uncached):
        forward, backward = step_fns(recipe)
        backward(forward())  # warm: first calls import and build caches
        launches.clear()
        uncached.clear()
        with _AtenOps() as ops:
            backward(forward())
        counted = dict(launches), dict(uncached)
        calls = Counter()

        def prof(frame, event, arg):
            if event in ("call", "c_call"):
                calls[event] += 1

        sys.setprofile(prof)
        try:
            backward(forward())
        finally:
            sys.setprofile(None)
    return {
        "launches": counted[0],
        "torch_kernels": {k: v for k, v in ops.names.items() if k not in NO_KERNEL_OPS},
        "launches_total": sum(counted[0].values())
        + sum(v for k, v in ops.names.items() if k not in NO_KERNEL_OPS),
        "triton_launches_not_through_launcher": counted[1],
        "aten_ops": dict(ops.names.most_common()),
        "aten_ops_total": sum(ops.names.values()),
        "allocations": ops.names["empty"] + ops.names["empty_like"],
        "python_calls": calls["call"],
        "c_calls": calls["c_call"],
    }


def time_step(recipe: str, steps: int) -> dict:
    """Median microseconds of the forward, the backward and the two, on this CPU."""
    with stubbed_launches(Counter()):
        forward, backward = step_fns(recipe)
        for _ in range(200):
            backward(forward())
        fwd, bwd, both = [], [], []
        for _ in range(steps):
            t0 = time.perf_counter_ns()
            state = forward()
            t1 = time.perf_counter_ns()
            backward(state)
            t2 = time.perf_counter_ns()
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            both.append(t2 - t0)
    med = statistics.median
    return {"forward_us": med(fwd) / 1e3, "backward_us": med(bwd) / 1e3, "step_us": med(both) / 1e3}


def to_markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# Host path of the cute backend's step on a CPU (launches counted, not run)",
        "",
        f"- date {meta['date']}, commit {meta['commit']}, torch {meta['torch']}, {meta['cpu']}; "
        f"B1 Hq2/Hkv1 S128 D128 causal; median of {meta['steps']} steps",
        "",
        "| recipe | forward us | backward us | step us | launches | allocations | aten ops | Python calls |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['recipe']} | {r['forward_us']:.1f} | {r['backward_us']:.1f} | {r['step_us']:.1f} "
            f"| {r['launches_total']} | {r['allocations']} | {r['aten_ops_total']} | {r['python_calls']} |"
        )
    lines += ["", "Launches per step:", ""]
    lines += [
        f"- {r['recipe']}: "
        + ", ".join(f"{k} {v}" for k, v in r["launches"].items())
        + "; torch: "
        + (", ".join(f"{k} {v}" for k, v in r["torch_kernels"].items()) or "none")
        for r in rows
    ]
    lines += [
        "",
        "Triton launches not through `triton.launch.launcher` (JITFunction's binding on every call):",
        "",
    ]
    lines += [
        f"- {r['recipe']}: "
        + (", ".join(f"{k} {v}" for k, v in r["triton_launches_not_through_launcher"].items()) or "none")
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", nargs="+", default=["fp8", "nvfp4qk_fp8pv"], choices=["fp8", "nvfp4qk_fp8pv"])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--out", default=None, help="output prefix (PREFIX.json, PREFIX.md)")
    a = p.parse_args(argv)
    try:
        import cutlass  # noqa: F401  (the cute backend's module imports it)
    except ImportError as err:
        print(
            f"host_path_cpu: needs nvidia-cutlass-dsl and flash-attn-4 (the cute extra): {err}",
            file=sys.stderr,
        )
        return 2
    rows = [{"recipe": r, **time_step(r, a.steps), **count_step(r)} for r in a.recipes]
    import platform

    meta = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": os.environ.get("BENCH_COMMIT", "unset"),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "steps": a.steps,
    }
    md = to_markdown(rows, meta)
    print(md)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{a.out}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        Path(f"{a.out}.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
