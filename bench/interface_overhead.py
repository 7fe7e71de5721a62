"""Host time of ``fp4_attention.attention`` itself: one training step (forward + backward) through the
public function and autograd, with a backend that computes nothing, against the same backend called
through a bare ``torch.autograd.Function`` (autograd's own cost).

    python bench/interface_overhead.py [--device cpu|cuda] [--shape 1,32,8,4096] [--steps 2000]
    python bench/interface_overhead.py --profile 20      # also the top host functions (cProfile)

The backend returns tensors allocated once, shaped as the cute backend's ``fp8`` results and saved
state (E4M3 Q/K with token scales, V transposed with channel scales, output and LSE), so the time is
what the interface adds around any backend's kernels: validation, backend resolution and support
checks, the saved state's flattening into autograd and back, layout permutes. At micro-batch 1
the attention step's kernels take about 1.1-1.5 ms on an H200 (``results/cute_unpromoted_h200``); what
the host spends here is paid on top wherever the host, not the GPU, bounds the step.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fp4_attention as fa  # noqa: E402
from fp4_attention import backends  # noqa: E402
from fp4_attention.backends import BackendSpec  # noqa: E402
from fp4_attention.numerics.operands import SavedState  # noqa: E402
from fp4_attention.numerics.quant import FP8Tensor  # noqa: E402

NAME = "null_timing"


class NullBackend:
    """Returns preallocated results in the cute backend's shapes and dtypes; computes nothing."""

    def __init__(self, device: str, b: int, hq: int, hkv: int, s: int, d: int):
        self.spec = BackendSpec(
            name=NAME,
            impl="unused:Unused",
            recipes=("fp8",),
            devices=(torch.device(device).type,),
            priority=-100,  # below every real backend: never what auto picks
        )
        e4, f32, bf = torch.float8_e4m3fn, torch.float32, torch.bfloat16
        z = dict(device=device)
        self.state = SavedState(
            q=FP8Tensor(data=torch.zeros(b, hq, s, d, dtype=e4, **z), scale=torch.ones(b, hq, s, 1, **z)),
            k=FP8Tensor(data=torch.zeros(b, hkv, s, d, dtype=e4, **z), scale=torch.ones(b, hkv, s, 1, **z)),
            v=FP8Tensor(data=torch.zeros(b, hkv, d, s, dtype=e4, **z), scale=torch.ones(b, hkv, 1, d, **z)),
            out=torch.zeros(b, s, hq, d, dtype=bf, **z).permute(0, 2, 1, 3),  # bshd memory
            lse=torch.zeros(b, hq, s, dtype=f32, **z),
        )
        self.grads = (
            torch.zeros(b, s, hq, d, dtype=bf, **z).permute(0, 2, 1, 3),
            torch.zeros(b, s, hkv, d, dtype=bf, **z).permute(0, 2, 1, 3),
            torch.zeros(b, s, hkv, d, dtype=bf, **z).permute(0, 2, 1, 3),
        )

    def forward(self, q, k, v, recipe, *, causal, softmax_scale):
        return self.state.out, self.state.lse, self.state

    def backward(self, state, dout, recipe, *, causal, softmax_scale):
        return self.grads


class _Bare(torch.autograd.Function):
    """The null backend behind nothing but autograd: the floor of any autograd-based interface."""

    @staticmethod
    def forward(ctx, q, k, v, backend):
        out, _, state = backend.forward(q, k, v, None, causal=True, softmax_scale=1.0)
        ctx.save_for_backward(state.q.data, state.q.scale, state.k.data, state.k.scale)
        ctx.backend = backend
        return out

    @staticmethod
    def backward(ctx, dout):
        dq, dk, dv = ctx.backend.backward(None, dout, None, causal=True, softmax_scale=1.0)
        return dq, dk, dv, None


def _per_step_us(step, steps: int, device: str) -> float:
    for _ in range(min(50, steps)):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e6


def measure(device: str, shape: tuple[int, int, int, int], steps: int, profile: int = 0) -> dict:
    """Host microseconds per forward + backward step: ``attention`` (bshd, causal, fp8) and the bare
    autograd Function, both on the null backend; with ``profile`` > 0 the top functions by own time."""
    b, hq, hkv, s = shape
    d = 128
    backend = NullBackend(device, b, hq, hkv, s, d)
    fa.register_backend(backend, replace=True)
    try:
        return _measure(backend, device, shape, d, steps, profile)
    finally:  # the registry as it was (the tests call this in their process)
        backends._SPECS.pop(NAME, None)
        backends._INSTANCES.pop(NAME, None)


def _measure(backend: NullBackend, device: str, shape, d: int, steps: int, profile: int) -> dict:
    b, hq, hkv, s = shape
    q = torch.zeros(b, s, hq, d, dtype=torch.bfloat16, device=device, requires_grad=True)
    k = torch.zeros(b, s, hkv, d, dtype=torch.bfloat16, device=device, requires_grad=True)
    v = torch.zeros(b, s, hkv, d, dtype=torch.bfloat16, device=device, requires_grad=True)
    g = torch.ones(b, s, hq, d, dtype=torch.bfloat16, device=device)
    qb, kb, vb = (t.permute(0, 2, 1, 3) for t in (q, k, v))

    def clear():
        q.grad = k.grad = v.grad = None

    def step_interface():
        fa.attention(q, k, v, recipe="fp8", causal=True, backend=NAME).backward(g)
        clear()

    def step_bare():
        _Bare.apply(qb, kb, vb, backend).permute(0, 2, 1, 3).backward(g)
        clear()

    res = {
        "device": device,
        "shape": list(shape),
        "steps": steps,
        "interface_us": _per_step_us(step_interface, steps, device),
        "bare_autograd_us": _per_step_us(step_bare, steps, device),
    }
    res["interface_own_us"] = res["interface_us"] - res["bare_autograd_us"]
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(500):
            step_interface()
        prof.disable()
        stats = pstats.Stats(prof).sort_stats("tottime")
        res["top_functions"] = [
            {
                "function": f"{Path(fn[0]).name}:{fn[1]}({fn[2]})",
                "calls_per_step": st[1] / 500,
                "own_us": st[2] / 500 * 1e6,
            }
            for fn, st in sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:profile]
        ]
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--shape", default="1,32,8,4096", help="B,Hq,Hkv,S (head dim 128)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--profile", type=int, default=0, help="print the N top host functions (cProfile)")
    p.add_argument("--out", help="write the result as JSON here")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("interface_overhead: --device cuda needs a CUDA GPU; use --device cpu")
    shape = tuple(int(x) for x in a.shape.split(","))
    if len(shape) != 4:
        raise SystemExit(f"interface_overhead: --shape is B,Hq,Hkv,S, got {a.shape!r}")
    res = measure(a.device, shape, a.steps, a.profile)
    print(
        f"{a.device} {a.shape}: attention() fwd+bwd {res['interface_us']:.1f} us/step, bare autograd "
        f"{res['bare_autograd_us']:.1f} us/step, the interface's own {res['interface_own_us']:.1f} us/step"
    )
    for row in res.get("top_functions", []):
        print(f"  {row['own_us']:8.1f} us  {row['calls_per_step']:5.1f} calls  {row['function']}")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
