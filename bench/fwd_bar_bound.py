"""What the forward issue's speed bars ask of the ``fp8`` CuTe kernel and of the quantization around
it, from one run of ``bench/attention_bench.py`` (its JSON: every row of one run, same-run baselines).

    python3 bench/fwd_bar_bound.py RUN.json [--copy-tbs 4.22] [--fp8-ceiling 1477] [--out PREFIX]

Issue 19's bars, per forward shape of the run:
- kernel: our ``fp8`` forward kernel (prepared operands, the fastest ``cute_fp8_kernel_only*`` row
  of the run) at least as fast as cuDNN FP8's (FP8 inputs);
- with quantization: ``cute_fp8`` (BF16 Q/K/V in, quantization and the kernel's launches included)
  at least 1.5x cuDNN BF16, so at most cuDNN BF16's time / 1.5;
- ``nvfp4qk_fp8pv``: its kernel at least 1.1x FA4 BF16's forward.

The quantization's floor is its fewest bytes (Q, K and V read once in BF16, their E4M3 codes and
FP32 scales written once: ``quant_bytes``) at the copy bandwidth ``--copy-tbs`` (TB/s, read + write,
measured by ``bench/quant_bench.py``; 4.22 on the H200 in ``results/session_2026-12-05_h200``), and
at the issue's 70% of it. What is left of the with-quantization budget is the most the kernel may
take; it is given as TFLOP/s, as a fraction of the FP8 dense GEMM ceiling ``--fp8-ceiling``
(contract §3: 1,477 TFLOP/s on the H200), and against cuDNN FP8's kernel of the same run. The last
column is what the with-quantization ratio would be if the other two bars were met exactly: a
kernel as fast as cuDNN FP8's and the quantization at 70% of the copy bandwidth.

Prints, and writes to ``PREFIX.{json,md}``. Times are the run's medians of CUDA-event timings (wall
time on the GPU's stream, launch gaps included), as ``attention_bench.py`` measures them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

QUANT_FRACTION = 0.70  # issue 19 item 3: the quantizers at >= 70% of the copy bandwidth
WITH_QUANT_RATIO = 1.5  # issue 19: fp8 with quantization >= 1.5x cuDNN BF16
NVFP4_RATIO = 1.1  # issue 19: nvfp4qk_fp8pv kernel >= 1.1x FA4 BF16


def fwd_flops(rec: dict) -> float:
    """The forward's FLOPs as ``attention_bench.py`` counts them: 4 B Hq S^2 D, halved when causal."""
    f = 4.0 * rec["B"] * rec["Hq"] * rec["S"] ** 2 * rec["D"]
    return f / 2 if rec["causal"] else f


def quant_bytes(rec: dict) -> int:
    """Fewest bytes of quantizing BF16 Q ``[B, Hq, S, D]``, K and V ``[B, Hkv, S, D]`` for the ``fp8``
    recipe: each read once (2 bytes per element) and written once as E4M3 (1 byte), with the FP32
    scales (per token of Q and K, per channel of V)."""
    b, hq, hkv, s, d = rec["B"], rec["Hq"], rec["Hkv"], rec["S"], rec["D"]
    elements = (hq + 2 * hkv) * b * s * d
    scales = (hq + hkv) * b * s + hkv * b * d
    return 3 * elements + 4 * scales


def _rows(records: list[dict]) -> dict:
    """``{shape: {impl: record}}`` of the forward rows."""
    by_shape: dict = {}
    for r in records:
        if r.get("pass") == "fwd":
            by_shape.setdefault(r["shape"], {})[r["impl"]] = r
    return by_shape


def _fastest(rows: dict, prefix: str):
    """``(impl, ms)`` of the fastest row whose name starts with ``prefix``, or None."""
    got = [(r["ms"], impl) for impl, r in rows.items() if impl.startswith(prefix)]
    return (min(got)[1], min(got)[0]) if got else None


def bound(run: dict, copy_tbs: float = 4.22, fp8_ceiling: float = 1477.0) -> list[dict]:
    """The numbers of the module docstring, one dict per forward shape of ``run`` (an
    ``attention_bench.py`` JSON) that has the baselines and our rows.

    Raises:
        ValueError: a bandwidth or ceiling that is not positive, or no shape with cuDNN BF16, cuDNN
            FP8 and a ``cute_fp8_kernel_only`` row.
    """
    if copy_tbs <= 0 or fp8_ceiling <= 0:
        raise ValueError(
            f"fwd_bar_bound: copy bandwidth and ceiling must be positive, got {copy_tbs}, {fp8_ceiling}"
        )
    out = []
    for shape, rows in _rows(run["records"]).items():
        kernel = _fastest(rows, "cute_fp8_kernel_only")
        if not {"cudnn_bf16", "cudnn_fp8"} <= rows.keys() or kernel is None:
            continue
        rec = rows["cudnn_fp8"]
        flops = fwd_flops(rec)
        c8, cb = rows["cudnn_fp8"]["ms"], rows["cudnn_bf16"]["ms"]
        floor = quant_bytes(rec) / (copy_tbs * 1e12) * 1e3
        budget = cb / WITH_QUANT_RATIO
        kernel_allowed = budget - floor / QUANT_FRACTION
        b = {
            "shape": shape,
            "fwd_gflop": flops / 1e9,
            "cudnn_fp8_ms": c8,
            "cudnn_fp8_tflops": flops / c8 / 1e9,
            "cudnn_bf16_ms": cb,
            "ours_kernel_impl": kernel[0],
            "ours_kernel_ms": kernel[1],
            "ours_kernel_tflops": flops / kernel[1] / 1e9,
            "kernel_bar_ms": c8,
            "kernel_speedup_needed": kernel[1] / c8,
            "quant_bytes": quant_bytes(rec),
            "quant_floor_ms": floor,
            "quant_at_70_ms": floor / QUANT_FRACTION,
            "with_quant_bar_ms": budget,
            "kernel_allowed_with_quant_at_70_ms": kernel_allowed,
            "kernel_allowed_with_quant_at_floor_ms": budget - floor,
            # cuDNN BF16 over (a kernel exactly at the kernel bar + quantization exactly at 70%)
            "ratio_at_kernel_and_quant_bars": cb / (c8 + floor / QUANT_FRACTION),
        }
        if kernel_allowed > 0:
            need = flops / kernel_allowed / 1e9
            b.update(
                kernel_tflops_needed=need,
                of_fp8_ceiling_needed=need / fp8_ceiling,
                vs_cudnn_fp8_needed=need / b["cudnn_fp8_tflops"],
            )
        if "cute_fp8" in rows:
            b["ours_with_quant_ms"] = rows["cute_fp8"]["ms"]
            b["ours_with_quant_speedup_needed"] = rows["cute_fp8"]["ms"] / budget
        nv = _fastest(rows, "cute_nvfp4qk_fp8pv_kernel_only")
        if nv is not None and "fa4_bf16" in rows:
            b.update(
                fa4_bf16_ms=rows["fa4_bf16"]["ms"],
                nvfp4_kernel_impl=nv[0],
                nvfp4_kernel_ms=nv[1],
                nvfp4_bar_ms=rows["fa4_bf16"]["ms"] / NVFP4_RATIO,
                nvfp4_vs_fa4=rows["fa4_bf16"]["ms"] / nv[1],
            )
        out.append(b)
    if not out:
        raise ValueError(
            "fwd_bar_bound: no forward shape with cudnn_bf16, cudnn_fp8 and cute_fp8_kernel_only rows "
            "(run attention_bench.py with --cute and the cuDNN baselines)"
        )
    return out


def to_markdown(bounds: list[dict], meta: dict, source: str, copy_tbs: float, fp8_ceiling: float) -> str:
    head = [
        "# The forward bars of issue 19 in time",
        "",
        f"- from `{source}` (`bench/fwd_bar_bound.py`): {meta.get('date', '?')}, {meta.get('gpu', '?')}, "
        f"commit {meta.get('commit', '?')}; copy bandwidth {copy_tbs} TB/s, "
        f"FP8 ceiling {fp8_ceiling:.0f} TFLOP/s",
        "",
        "| shape | ours kernel (ms, TFLOP/s) | cuDNN FP8 kernel | speedup needed | ours with quant. "
        "| bar: cuDNN BF16 / 1.5 | quant. floor / at 70% | kernel allowed (at 70%) | TFLOP/s needed "
        "(of ceiling, vs cuDNN FP8) | x cuDNN BF16 at the kernel and 70% bars |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for b in bounds:
        need = (
            f"{b['kernel_tflops_needed']:.0f} "
            f"({b['of_fp8_ceiling_needed']:.0%}, {b['vs_cudnn_fp8_needed']:.2f}x)"
            if "kernel_tflops_needed" in b
            else "none left"
        )
        rows.append(
            f"| {b['shape']} | {b['ours_kernel_ms']:.3f}, {b['ours_kernel_tflops']:.0f} "
            f"| {b['cudnn_fp8_ms']:.3f}, {b['cudnn_fp8_tflops']:.0f} | {b['kernel_speedup_needed']:.2f}x "
            f"| {b.get('ours_with_quant_ms', float('nan')):.3f} | {b['with_quant_bar_ms']:.3f} "
            f"| {b['quant_floor_ms']:.3f} / {b['quant_at_70_ms']:.3f} "
            f"| {b['kernel_allowed_with_quant_at_70_ms']:.3f} | {need} "
            f"| {b['ratio_at_kernel_and_quant_bars']:.2f}x |"
        )
    nv = [
        f"| {b['shape']} | {b['nvfp4_kernel_ms']:.3f} ({b['nvfp4_kernel_impl']}) | {b['fa4_bf16_ms']:.3f} "
        f"| {b['nvfp4_bar_ms']:.3f} | {b['nvfp4_vs_fa4']:.2f}x |"
        for b in bounds
        if "nvfp4_kernel_ms" in b
    ]
    tail = []
    if nv:
        tail = [
            "",
            "| shape | nvfp4qk_fp8pv kernel ms | FA4 BF16 fwd ms | bar (FA4 / 1.1) | today |",
            "|---|---|---|---|---|",
            *nv,
        ]
    return "\n".join(head + rows + tail) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="attention_bench.py JSON of one run")
    p.add_argument("--copy-tbs", type=float, default=4.22, help="device copy bandwidth, TB/s (read + write)")
    p.add_argument("--fp8-ceiling", type=float, default=1477.0, help="FP8 dense GEMM ceiling, TFLOP/s")
    p.add_argument("--out", default=None, help="output prefix (PREFIX.json, PREFIX.md)")
    a = p.parse_args(argv)
    try:
        run = json.loads(Path(a.run).read_text())
        bounds = bound(run, a.copy_tbs, a.fp8_ceiling)
    except (OSError, ValueError, KeyError) as err:
        print(f"fwd_bar_bound: {err}", file=sys.stderr)
        return 2
    md = to_markdown(bounds, run.get("meta", {}), a.run, a.copy_tbs, a.fp8_ceiling)
    print(md)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        doc = {"source": a.run, "copy_tbs": a.copy_tbs, "fp8_ceiling": a.fp8_ceiling, "bounds": bounds}
        Path(f"{a.out}.json").write_text(json.dumps(doc, indent=1) + "\n")
        Path(f"{a.out}.md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
