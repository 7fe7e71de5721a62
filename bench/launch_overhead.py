"""Host microseconds per call of the attention step's parts on a CUDA GPU, at a shape so small that
the GPU never bounds the loop: where the host time of a step goes, without a profiler's inflation.

    python3 bench/launch_overhead.py [--calls 2000] [--out PREFIX]

Rows (each the wall time of ``--calls`` back-to-back calls over their count, synchronized once at
the end; B1 Hq2/Hkv1 S128 D128, BF16 inputs):

- ``step_{cute_fp8,fa4_bf16}``: ``fa.attention`` forward + backward through autograd;
- ``backward_{cute_fp8,fa4_bf16}``: the backward alone, through autograd, on one forward's graph;
- ``forward_{cute_fp8,fa4_bf16}``: ``fa.attention`` alone (inputs that require grad);
- the cute backend's parts, without autograd: ``cute_forward_quant``, its Q/K/V quantizers
  (``backend.quantize_inputs``, 4 Triton launches); ``cute_kernel_operands``; ``cute_forward_kernel``
  (``forward_fp8`` on prepared operands); ``cute_backend_forward`` (``CuteBackend.forward``: all
  three); ``cute_backward_operands`` (``backend.backward_operands``: 3 Triton launches, one fill, the
  allocations); ``cute_backward_fp8`` (``backend.backward_fp8``: operands, kernel, the postprocess
  launch); ``fa4_backend_forward`` (``FA4Backend.forward``); ``flatten_state`` /
  ``restore_state``: the cute ``fp8`` saved state into autograd's tensors and back (the interface's
  own work around the backend, ``backends/base.py``);
- ``triton_launch``: one launch of the dO kernel (``_dout_quant_kernel``, 34 arguments) through
  ``JITFunction.__getitem__``; ``triton_compiled_launch``: the same compiled kernel launched through
  ``CompiledKernel.__getitem__`` (no argument binding, no cache lookup); ``triton_raw_launch``:
  through ``CompiledKernel.run`` with the grid and stream given (the launcher alone);
- ``torch_empty``: one ``torch.empty`` of 1 MiB on the GPU;
- every row above with the Triton launch cache off (``FP4_ATTENTION_TRITON_LAUNCH_CACHE=0``: each
  launch through ``JITFunction``); ``*_launch_cache``: the step, the quantizers, the backward's
  operands and the dO kernel's launch again with it on (the default, ``backends/triton/launch.py``),
  in the same process. (The host drifts by tens of percent over a run: ``bench/host_stages.py
  --ab-env`` compares the two in alternate blocks of steps.)

Outputs ``PREFIX.json`` and ``PREFIX.md`` (date, GPU, commit from ``$BENCH_COMMIT``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_stages import set_env  # noqa: E402

SHAPE = (1, 2, 1, 128, 128)  # B, Hq, Hkv, S, D


def host_us(fn, calls: int) -> float:
    """Microseconds of host time per call of ``fn`` (after 20 warm calls)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / calls


def rows(calls: int) -> dict[str, float]:
    from fp4_attention.backends.triton import launch as tl_launch

    before = os.environ.get(tl_launch.ENV)
    os.environ[tl_launch.ENV] = "0"  # the rows through JITFunction; the *_launch_cache rows set it to 1
    try:
        return _rows(calls, tl_launch)
    finally:
        set_env(tl_launch.ENV, before)  # the caller's value back


def _rows(calls: int, tl_launch) -> dict[str, float]:
    import fp4_attention as fa
    from fp4_attention.backends.cute import backend as cb
    from fp4_attention.backends.triton import dout_quant as dq

    b, hq, hkv, s, d = SHAPE
    torch.manual_seed(0)
    q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn_like(q)
    out = {}
    for backend, recipe in (("cute", "fp8"), ("fa4", "bf16")):

        def step(backend=backend, recipe=recipe):
            fa.attention(q, k, v, recipe=recipe, backend=backend, causal=True, layout="bhsd").backward(dout)

        out[f"step_{backend}_{recipe}"] = host_us(step, calls)
        out[f"forward_{backend}_{recipe}"] = host_us(
            lambda backend=backend, recipe=recipe: fa.attention(
                q, k, v, recipe=recipe, backend=backend, causal=True, layout="bhsd"
            ),
            calls,
        )
        o = fa.attention(q, k, v, recipe=recipe, backend=backend, causal=True, layout="bhsd")
        out[f"backward_{backend}_{recipe}"] = host_us(
            lambda o=o: torch.autograd.backward(o, dout, retain_graph=True), calls
        )
    qd, kd, vd, rec, sm = q.detach(), k.detach(), v.detach(), fa.get_recipe("fp8"), d**-0.5
    out["cute_forward_quant"] = host_us(lambda: cb.quantize_inputs(qd, kd, vd), calls)
    qs = cb.quantize_inputs(qd, kd, vd)
    out["cute_kernel_operands"] = host_us(lambda: cb.kernel_operands(*qs, sm), calls)
    ops = cb.kernel_operands(*qs, sm)
    out["cute_forward_kernel"] = host_us(lambda: cb.forward_fp8(*ops, causal=True), calls)
    out["cute_backend_forward"] = host_us(
        lambda: cb.CuteBackend().forward(qd, kd, vd, rec, causal=True, softmax_scale=sm), calls
    )
    _, _, state = cb.CuteBackend().forward(qd, kd, vd, rec, causal=True, softmax_scale=sm)
    from fp4_attention.backends.base import flatten_state, restore_state

    skeleton, tensors = flatten_state(state)
    out["flatten_state"] = host_us(lambda: flatten_state(state), calls)
    out["restore_state"] = host_us(lambda: restore_state(skeleton, tensors), calls)
    out["cute_backward_operands"] = host_us(lambda: cb.backward_operands(state, dout, sm), calls)
    out["cute_backward_fp8"] = host_us(
        lambda: cb.backward_fp8(state, dout, causal=True, softmax_scale=sm), calls
    )
    # the backward's pieces: the kernel's argument views, the compiled kernel's call alone (TVM-FFI,
    # 17 tensors), the postprocess launch (triton.bwd_post), the accumulator fill
    bops = cb.backward_operands(state, dout, sm)
    out["cute_bwd_args"] = host_us(
        lambda: [t.view(torch.uint8) if t.element_size() == 1 else t for t in cb._bwd_args(bops)], calls
    )
    bargs = [t.view(torch.uint8) if t.element_size() == 1 else t for t in cb._bwd_args(bops)]
    bfn = cb._compiled_bwd(d, hq // hkv, True, False, cb._bwd_args(bops), sm)
    out["cute_bwd_kernel_call"] = host_us(lambda: bfn(*bargs, sm), calls)
    out["cute_bwd_postprocess"] = host_us(lambda: cb.postprocess_gradients(bops, state, sm), calls)
    out["torch_zeros"] = host_us(lambda: torch.zeros(1 << 18, device="cuda"), calls)
    # the operand tensors (ops[6] is kernel_operands' scalar qk_scale_log2)
    out["cute_forward_checks"] = host_us(lambda: cb._check_operands(*ops[:6], cb.DEFAULT_TILES), calls)
    from fp4_attention.backends.fa4.backend import FA4Backend

    out["fa4_backend_forward"] = host_us(
        lambda: FA4Backend().forward(qd, kd, vd, fa.get_recipe("bf16"), causal=True, softmax_scale=sm), calls
    )

    # one Triton kernel three ways: the dO kernel with the arguments quantize_dout_fused gives it
    captured = {}
    launch = dq._dout_quant_kernel.run

    def spy(*args, grid, warmup, **kwargs):
        captured.update(args=args, grid=grid, kwargs=kwargs)
        return launch(*args, grid=grid, warmup=warmup, **kwargs)

    dq._dout_quant_kernel.run = spy
    try:
        cb.backward_operands(state, dout, d**-0.5)
    finally:
        del dq._dout_quant_kernel.run  # the instance attribute; the class's run is back
    args, grid, kwargs = captured["args"], captured["grid"], captured["kwargs"]
    out["triton_launch"] = host_us(lambda: dq._dout_quant_kernel[grid](*args, **kwargs), calls)
    compiled = dq._dout_quant_kernel[grid](*args, **kwargs)
    params = dq._dout_quant_kernel.params
    bound = list(args) + [kwargs[p.name] for p in params[len(args) :] if p.name in kwargs]
    g = tuple(grid) + (1,) * (3 - len(grid))
    runner = compiled[g]
    out["triton_compiled_launch"] = host_us(lambda: runner(*bound), calls)
    stream = torch.cuda.current_stream().cuda_stream
    run, fn, meta = compiled.run, compiled.function, compiled.packed_metadata
    out["triton_raw_launch"] = host_us(lambda: run(*g, stream, fn, meta, None, None, None, *bound), calls)
    out["torch_empty"] = host_us(lambda: torch.empty(1 << 18, device="cuda"), calls)
    # the same parts with the launch cache of backends/triton/launch.py (the default)
    os.environ[tl_launch.ENV] = "1"

    def step_cached():
        fa.attention(q, k, v, recipe="fp8", backend="cute", causal=True, layout="bhsd").backward(dout)

    out["step_cute_fp8_launch_cache"] = host_us(step_cached, calls)
    out["cute_forward_quant_launch_cache"] = host_us(lambda: cb.quantize_inputs(qd, kd, vd), calls)
    out["cute_backward_operands_launch_cache"] = host_us(lambda: cb.backward_operands(state, dout, sm), calls)
    launcher = tl_launch.launcher(dq._dout_quant_kernel)
    out["triton_launch_cache"] = host_us(lambda: launcher[grid](*args, **kwargs), calls)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", default=None, help="output prefix (PREFIX.json, PREFIX.md)")
    a = p.parse_args(argv)
    if a.calls < 1:
        p.error(f"--calls must be >= 1, got {a.calls}")
    if not torch.cuda.is_available():
        print("launch_overhead: needs a CUDA GPU; this machine has none", file=sys.stderr)
        return 2
    meta = {
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "gpu": torch.cuda.get_device_name(),
        "commit": os.environ.get("BENCH_COMMIT", "unknown"),
        "shape": dict(zip(("B", "Hq", "Hkv", "S", "D"), SHAPE)),
        "calls": a.calls,
    }
    us = rows(a.calls)
    lines = [
        "# Host time per call (us), B1 Hq2/Hkv1 S128 D128 causal",
        "",
        f"- {meta['date_utc']} UTC, {meta['gpu']}, commit {meta['commit']}, {a.calls} calls per row",
        "",
        "| row | us / call |",
        "|---|---|",
        *[f"| `{k}` | {v:.1f} |" for k, v in us.items()],
    ]
    print("\n".join(lines))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{a.out}.json").write_text(json.dumps({**meta, "host_us_per_call": us}, indent=1))
        Path(f"{a.out}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
