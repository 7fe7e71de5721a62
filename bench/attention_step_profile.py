"""Where one attention training step goes: every GPU kernel's time, and host time against GPU time.

    python3 bench/attention_step_profile.py --backend cute --recipe fp8 --shape 4,32,8,4096 --causal \\
        --out $OUT/step_profile_cute_fp8_B4

One step is what training pays: ``fa.attention`` on BF16 ``[B, S, H, D]`` inputs (quantization
included) and ``out.backward(dout)`` through autograd. After ``--warmup`` steps, ``--steps`` steps run
under ``torch.profiler`` (CPU and CUDA activities). The report gives, per kernel name, the summed CUDA
time per step (ms) and its launches per step, sorted by time; and per step the host wall time
(CUDA-synchronized, from the first launch to the end of the last kernel) against the summed kernel
time. Host time well above the kernel time means the step is bound by launches (Python, autograd,
the torch operand preparation), not by the kernels; a benchmark that times such a step measures the
host. ``--part backward`` profiles the backward alone (on one forward's saved state, the autograd
graph kept with ``retain_graph``). ``--host-profile`` then also runs the steps under ``cProfile``
(no profiler of CUDA, no synchronization inside) and lists the Python functions that take the host's
time per step (own and cumulative ms, calls per step): where launches cost.

Outputs: ``PREFIX.json`` (per kernel: name, ms per step, launches per step; host and kernel ms per
step; shape, backend, recipe, date UTC, GPU, commit from ``$BENCH_COMMIT``) and ``PREFIX.md``.
Needs a CUDA GPU and, for ``--backend cute``/``fa4``, the ``cute`` extra.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.fidelity import backend_options, check_backend_options  # noqa: E402

D = 128


def _shape(text: str) -> tuple[int, int, int, int]:
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) != 4 or min(vals) <= 0:
        raise ValueError(f"--shape must be B,Hq,Hkv,S (positive integers), got {text!r}")
    return vals


def kernel_table(events, steps: int) -> list[dict]:
    """Per kernel name (CUDA device events of ``torch.profiler``): ms and launches per step, largest
    first. ``events``: the profiler's ``events()`` (each with ``device_type``, ``name``,
    ``device_time`` in us)."""
    total, count = defaultdict(float), defaultdict(int)
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name] += e.device_time
            count[e.name] += 1
    rows = [
        {"kernel": name, "ms_per_step": total[name] / 1e3 / steps, "launches_per_step": count[name] / steps}
        for name in total
    ]
    return sorted(rows, key=lambda r: -r["ms_per_step"])


def host_profile(step, steps: int, top: int = 40) -> list[dict]:
    """Run ``step()`` ``steps`` times under ``cProfile``; per function (``file:line(name)``), its calls,
    own and cumulative ms per step, the ``top`` largest by own time."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    rows = [
        {
            "function": f"{Path(file).name}:{line}({name})",
            "calls_per_step": calls / steps,
            "own_ms_per_step": own * 1e3 / steps,
            "cum_ms_per_step": cum * 1e3 / steps,
        }
        for (file, line, name), (_, calls, own, cum, _) in pstats.Stats(prof).stats.items()
    ]
    return sorted(rows, key=lambda r: -r["own_ms_per_step"])[:top]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="cute")
    p.add_argument("--recipe", default="fp8")
    p.add_argument("--shape", default="4,32,8,4096", help="B,Hq,Hkv,S (D = 128)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--part", choices=("step", "backward"), default="step")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out", required=True, help="output prefix (PREFIX.json, PREFIX.md)")
    p.add_argument("--host-profile", action="store_true", help="also the Python functions by host time")
    p.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a keyword option of fa.attention for the backend (repeatable), as in tools/fidelity.py",
    )
    a = p.parse_args(argv)
    import fp4_attention as fa

    try:
        b, hq, hkv, s = _shape(a.shape)
    except ValueError as err:
        p.error(str(err))  # exit 2, one sentence
    if a.backend not in fa.available_backends():
        p.error(
            f"--backend {a.backend!r} is not a backend; choose one of {', '.join(fa.available_backends())}"
        )
    try:
        options = backend_options(a.backend_option)
        check_backend_options(a.backend, options)
    except ValueError as err:
        p.error(str(err))
    if not torch.cuda.is_available():
        print("attention_step_profile: needs a CUDA GPU; this machine has none", file=sys.stderr)
        return 2

    torch.manual_seed(0)
    q, k, v = (
        torch.randn(b, s, h, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for h in (hq, hkv, hkv)
    )
    dout = torch.randn(b, s, hq, D, device="cuda", dtype=torch.bfloat16)

    def forward():
        return fa.attention(q, k, v, recipe=a.recipe, backend=a.backend, causal=a.causal, **options)

    if a.part == "backward":
        out = forward()

        def step():
            torch.autograd.backward(out, dout, retain_graph=True)
    else:

        def step():
            forward().backward(dout)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        host_ms = (time.perf_counter() - t0) * 1e3 / a.steps
    rows = kernel_table(prof.events(), a.steps)
    kernel_ms = sum(r["ms_per_step"] for r in rows)
    host_rows = host_profile(step, a.steps) if a.host_profile else []
    torch.cuda.synchronize()
    meta = {
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "gpu": torch.cuda.get_device_name(),
        "commit": os.environ.get("BENCH_COMMIT", "unknown"),
        "backend": a.backend,
        "backend_options": options,
        "recipe": a.recipe,
        "shape": {"B": b, "Hq": hq, "Hkv": hkv, "S": s, "D": D, "causal": a.causal},
        "part": a.part,
        "steps": a.steps,
        "host_ms_per_step": host_ms,
        "kernel_ms_per_step": kernel_ms,
        "note": "host time is measured under the profiler, which adds its own overhead per launch",
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    record = {**meta, "kernels": rows, "host_functions": host_rows}
    Path(f"{a.out}.json").write_text(json.dumps(record, indent=1))
    lines = [
        f"# Attention {a.part} profile: {a.backend} {a.recipe}, B{b} H{hq}/{hkv} S{s} D{D}"
        + (" causal" if a.causal else "")
        + (f", options {options}" if options else ""),
        "",
        f"- {meta['date_utc']} UTC, {meta['gpu']}, commit {meta['commit']}, {a.steps} profiled steps",
        f"- per step: host {host_ms:.3f} ms (synchronized, under the profiler), kernels {kernel_ms:.3f} ms",
        "",
        "| kernel | ms / step | launches / step |",
        "|---|---|---|",
        *[f"| `{r['kernel'][:90]}` | {r['ms_per_step']:.3f} | {r['launches_per_step']:g} |" for r in rows],
    ]
    if host_rows:
        lines += [
            "",
            f"Host, under cProfile ({a.steps} steps; cProfile slows Python down, compare the rows):",
            "",
            "| function | calls / step | own ms / step | cumulative ms / step |",
            "|---|---|---|---|",
            *[
                f"| `{r['function'][:90]}` | {r['calls_per_step']:g} | {r['own_ms_per_step']:.3f} | "
                f"{r['cum_ms_per_step']:.3f} |"
                for r in host_rows
            ],
        ]
    Path(f"{a.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
