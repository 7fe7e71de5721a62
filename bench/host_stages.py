"""Where the host time of one attention training step goes, stage by stage, as medians over many
steps (robust to the GPU machine's noisy host, where whole rows of ``launch_overhead.py`` moved by
30-70% between runs).

    python3 bench/host_stages.py [--steps 2000] [--shape B,Hq,Hkv,S] [--out PREFIX]

Each stage is a function of the step's path, wrapped in place by a timer (``time.perf_counter_ns``,
about 0.2 us per wrapped call); its time per step is inclusive (a stage's callees count in it as
well as in their own rows), summed over its calls in the step, then the median over the steps.
``step`` is ``fa.attention(...).backward(dout)`` for the ``cute`` backend (recipe ``fp8``) and the
``fa4`` backend (``bf16``), causal, BF16 ``bhsd`` inputs (with ``--ab-env VAR``: the ``cute``
backend alone, VAR 0 and 1 in alternate blocks of 100 steps, one column each);
``autograd_and_interface`` is the step less
the backend's own forward and backward: the interface's checks, ``torch.autograd.Function``, the
saved-state handling and the autograd engine. No GPU synchronisation inside the loop: the shape is
so small that the GPU never bounds it (default B1 Hq2/Hkv1 S128 D128).

Outputs ``PREFIX.json`` and ``PREFIX.md`` (date, GPU, commit from ``$BENCH_COMMIT``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

D = 128


class Timers:
    """Inclusive nanoseconds per wrapped function, summed per step."""

    def __init__(self):
        self.step = 0
        self.ns: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))

    def wrap(self, owner, name: str, label: str | None = None):
        """Replace ``owner.name`` by a timed wrapper; returns a function that puts it back."""
        fn = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        inner = fn.__func__ if isinstance(fn, staticmethod) else fn
        row = self.ns[label or name]

        def timed(*args, **kwargs):
            t0 = time.perf_counter_ns()
            try:
                return inner(*args, **kwargs)
            finally:
                row[self.step] += time.perf_counter_ns() - t0

        setattr(owner, name, staticmethod(timed) if isinstance(fn, staticmethod) else timed)
        return lambda: setattr(owner, name, fn)

    def medians_us(self, steps) -> dict[str, float]:
        return {k: statistics.median(v.get(s, 0) for s in steps) / 1e3 for k, v in self.ns.items()}


def set_env(name: str, value: str | None) -> None:
    """``os.environ[name] = value``, or unset it for None (putting back a value read before)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def stages(backend: str) -> list[tuple]:
    """``(owner, attribute, label)`` of the functions timed for ``backend``."""
    from fp4_attention import interface
    from fp4_attention.backends.cute import backend as cb
    from fp4_attention.backends.fa4 import backend as fb

    common = [
        (interface, "_validate", "interface._validate"),
        (interface, "check_supported", "interface.check_supported"),
        (interface._AttentionFunction, "forward", "Function.forward"),
        (interface._AttentionFunction, "backward", "Function.backward"),
        (interface, "flatten_state", "flatten_state"),
        (interface, "restore_state", "restore_state"),
    ]
    if backend == "fa4":
        return common + [
            (fb.FA4Backend, "forward", "backend.forward"),
            (fb.FA4Backend, "backward", "backend.backward"),
        ]
    return common + [
        (cb.CuteBackend, "forward", "backend.forward"),
        (cb.CuteBackend, "backward", "backend.backward"),
        (cb, "quantize_inputs", "cute.quantize_inputs"),
        (cb, "quantize_fp8_rows", "cute.quantize_fp8_rows"),
        (cb, "quantize_fp8_rows_pair", "cute.quantize_fp8_rows_pair"),
        (cb, "quantize_fp8_v_transposed", "cute.quantize_fp8_v_transposed"),
        (cb, "kernel_operands", "cute.kernel_operands"),
        (cb, "forward_fp8", "cute.forward_fp8"),
        (cb, "_check_operands", "cute._check_operands"),
        (cb, "_compiled", "cute._compiled (lookup + nothing else)"),
        (cb, "backward_operands", "cute.backward_operands"),
        (cb, "quantize_dout_fused", "cute.quantize_dout_fused"),
        (cb, "backward_kv_operands", "cute.backward_kv_operands"),
        (cb, "_bwd_args", "cute._bwd_args"),
        (cb, "_compiled_bwd", "cute._compiled_bwd (lookup)"),
        (cb, "postprocess_gradients", "cute.postprocess_gradients"),
        (cb, "convert_accumulators", "cute.triton.bwd_post launch"),
    ]


def run(backend: str, recipe: str, shape: tuple, steps: int, ab_env: str | None = None) -> dict[str, float]:
    import fp4_attention as fa

    b, hq, hkv, s = shape
    torch.manual_seed(0)
    q = torch.randn(b, hq, s, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn_like(q)
    timers = Timers()
    undo = [timers.wrap(owner, name, label) for owner, name, label in stages(backend)]
    step_ns = timers.ns["step"]
    before = os.environ.get(ab_env) if ab_env is not None else None
    try:
        for i in range(-50, steps):  # 50 warm steps, not counted
            timers.step = i
            if ab_env is not None:  # blocks of 100 steps, the variable alternately 0 and 1
                os.environ[ab_env] = str((i // 100) % 2)
            t0 = time.perf_counter_ns()
            fa.attention(q, k, v, recipe=recipe, backend=backend, causal=True, layout="bhsd").backward(dout)
            step_ns[i] += time.perf_counter_ns() - t0
        torch.cuda.synchronize()
    finally:
        for u in reversed(undo):
            u()
        if ab_env is not None:  # the caller's value back
            set_env(ab_env, before)
    if ab_env is not None:
        blocks = {v: [i for i in range(steps) if (i // 100) % 2 == v] for v in (0, 1)}
        return {f"{ab_env}={v}": timers.medians_us(sel) for v, sel in blocks.items()}
    us = timers.medians_us(range(steps))
    us["autograd_and_interface"] = statistics.median(
        (step_ns[i] - timers.ns["backend.forward"][i] - timers.ns["backend.backward"][i]) / 1e3
        for i in range(steps)
    )
    return us


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--shape", default="1,2,1,128", help="B,Hq,Hkv,S (D = 128)")
    p.add_argument("--out", default=None, help="output prefix (PREFIX.json, PREFIX.md)")
    p.add_argument(
        "--ab-env",
        default=None,
        metavar="VAR",
        help="the cute backend alone, with the environment variable VAR set to 0 and 1 in alternate blocks "
        "of 100 steps: one column per value (an A/B in one process, e.g. FP4_ATTENTION_TRITON_LAUNCH_CACHE)",
    )
    a = p.parse_args(argv)
    shape = tuple(int(x) for x in a.shape.split(","))
    if len(shape) != 4 or min(shape) < 1 or shape[1] % shape[2] or a.steps < 1:
        p.error(
            f"--shape needs four positive ints B,Hq,Hkv,S with Hq % Hkv == 0, and --steps >= 1; got {a.shape}"
        )
    if not torch.cuda.is_available():
        print("host_stages: needs a CUDA GPU; this machine has none", file=sys.stderr)
        return 2
    if a.ab_env:
        results = run("cute", "fp8", shape, a.steps, a.ab_env)
    else:
        results = {
            name: run(name, recipe, shape, a.steps) for name, recipe in (("cute", "fp8"), ("fa4", "bf16"))
        }
    columns = list(results)
    meta = {
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "gpu": torch.cuda.get_device_name(),
        "commit": os.environ.get("BENCH_COMMIT", "unknown"),
        "shape": dict(zip(("B", "Hq", "Hkv", "S"), shape), D=D),
        "steps": a.steps,
    }
    lines = [
        f"# Host time per training step by stage (median us over {a.steps} steps), B{shape[0]} "
        f"Hq{shape[1]}/Hkv{shape[2]} S{shape[3]} D{D} causal",
        "",
        f"- {meta['date_utc']} UTC, {meta['gpu']}, commit {meta['commit']}; inclusive times (a stage's "
        "callees are in it too)",
        "",
        "| stage | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for n in dict.fromkeys(n for c in columns for n in results[c]):
        cells = [f"{results[c][n]:.1f}" if n in results[c] else "" for c in columns]
        lines.append(f"| `{n}` | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{a.out}.json").write_text(json.dumps({**meta, "median_us_per_step": results}, indent=1))
        Path(f"{a.out}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
