"""Forward-kernel tile sweep on one GPU: correctness against the reference and kernel-only speed.

    python bench/tune_fwd.py --out results/tune_fwd_h200      # writes .json and .md

For each recipe (bf16, fp8, nvfp4qk_fp8pv) and tile configuration (BLOCK_M, BLOCK_N, warps,
stages), and for the masked-every-tile loop (``split=False``, the kernel before commit "forward:
unmasked fast path") against the split loop: (1) the output vs ``reference_forward_quantized`` on
the same quantized operands with the same BLOCK_N (rel-L2 and max |dLSE|, at B2 H8/2 S300, ragged);
(2) kernel-only TFLOP/s (operands quantized once outside the timed region; FLOPs = 4*B*Hq*S^2*D,
halved for causal) on B4 H32/8 S4096 causal and B2 H32/32 S8192 non-causal; medians of
``triton.testing.do_bench``. For fp8 it also times the QK product with an FP32 promotion every
32 head-dim elements (``IMPRECISE_K=32``, not the recipe: it shows what that promotion costs).
Then the backward tile sweep (``--no-backward`` skips it) and the time of each quantization step
of the forward at B4 H32/8 S4096.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fp4_attention as fa  # noqa: E402
from fp4_attention.backends.triton import backend as tb  # noqa: E402
from fp4_attention.numerics.reference import reference_forward_quantized  # noqa: E402
from tests.conftest import make_qkv, rel_l2  # noqa: E402

D = 128
CONFIGS = [  # (BLOCK_M, BLOCK_N, warps, stages, split); the first sweep (2026-11-29, fp8) also had
    # (128, 64, 8, 3, False) 328/430, (128, 64, 8, 2/4, True), (128, 128, 8, 2, True), (128, 64, 4, 3, True)
    (128, 64, 8, 3, True),
    (64, 64, 4, 3, True),
    (64, 64, 4, 4, True),
    (64, 64, 4, 2, True),
    (64, 128, 4, 3, True),
]
SHAPES = [(4, 32, 8, 4096, True), (2, 32, 32, 8192, False)]


def operands(recipe, q, k, v):
    """Kernel operands of ``recipe`` for BF16 q/k/v, quantized once (as the backend does)."""
    rec = fa.get_recipe(recipe)
    be = tb.TritonBackend()
    _, _, st = be.forward(q, k, v, rec, causal=False, softmax_scale=D**-0.5)
    return rec, st, tb.forward_operands(st.q, st.k, st.v, rec, q.shape, k.shape)


def run_config(rec, ops, cfg, causal, seq_k):
    bm, bn, nw, ns, split = cfg
    return tb.launch_forward(
        *ops,
        rec,
        causal=causal,
        softmax_scale=D**-0.5,
        seq_k=seq_k,
        block_m=bm,
        block_n=bn,
        num_warps=nw,
        num_stages=ns,
        split=split,
    )


def check(recipe, cfg):
    """Worst (rel-L2 of out, max |dLSE|) vs the reference on the same quantized operands, causal and not."""
    q, k, v = make_qkv(2, 8, 2, 300, 300, D, seed=7, scale=2.0, device="cuda")
    rec, st, ops = operands(recipe, q, k, v)
    v_ref = st.v if rec.pv != "fp8" else type(st.v)(data=st.v.data.transpose(-1, -2), scale=st.v.scale)
    worst = (0.0, 0.0)
    for causal in (True, False):
        out, lse = run_config(rec, ops, cfg, causal, 300)
        rout, rlse, _ = reference_forward_quantized(
            st.q, st.k, v_ref, rec, causal=causal, softmax_scale=D**-0.5, block_n=cfg[1]
        )
        fin = torch.isfinite(rlse)
        worst = (max(worst[0], rel_l2(out, rout)), max(worst[1], float((lse[fin] - rlse[fin]).abs().max())))
    return worst


BWD_DKDV = [(64, 64, 8, 2), (64, 64, 4, 2), (128, 64, 8, 2), (64, 128, 8, 2)]
BWD_DQ = [(64, 64, 4, 2), (128, 64, 8, 2)]


def backward_sweep(recipes):
    """Time the backward (dO quantization + dK/dV + dQ kernels) with each dK/dV tile choice (dQ at
    its default) and each dQ tile choice (dK/dV at its default); grads vs the default tiles' grads."""
    rows = []
    for recipe in (r for r in recipes if r == "fp8"):  # the training target; the kernels are shared
        rec = fa.get_recipe(recipe)
        be = tb.TritonBackend()
        q, k, v = make_qkv(4, 32, 8, 4096, 4096, D, seed=4, device="cuda")
        dout = torch.randn_like(q)
        _, _, st = be.forward(q, k, v, rec, causal=True, softmax_scale=D**-0.5)
        default = (tb.BWD_DKDV_TILES, tb.BWD_DQ_TILES)
        ref = be.backward(st, dout, rec, causal=True, softmax_scale=D**-0.5)
        combos = [(t, default[1]) for t in BWD_DKDV] + [(default[0], t) for t in BWD_DQ if t != default[1]]
        for dkdv, dq in combos:
            row = {"recipe": recipe, "dkdv": list(dkdv), "dq": list(dq)}
            tb.BWD_DKDV_TILES, tb.BWD_DQ_TILES = dkdv, dq
            try:
                grads = be.backward(st, dout, rec, causal=True, softmax_scale=D**-0.5)
                row["rel_l2"] = round(max(rel_l2(g, r) for g, r in zip(grads, ref)), 6)
                row["ms"] = round(
                    triton.testing.do_bench(
                        lambda: be.backward(st, dout, rec, causal=True, softmax_scale=D**-0.5),
                        warmup=30,
                        rep=100,
                        return_mode="median",
                    ),
                    4,
                )
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            finally:
                tb.BWD_DKDV_TILES, tb.BWD_DQ_TILES = default
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/tune_fwd_h200")
    p.add_argument("--recipes", nargs="+", default=["fp8", "nvfp4qk_fp8pv", "bf16"])
    p.add_argument(
        "--no-backward", dest="backward", action="store_false", help="skip the backward tile sweep"
    )
    p.add_argument("--only-backward", action="store_true", help="only the backward tile sweep")
    a = p.parse_args(argv)
    commit = (
        os.environ.get("BENCH_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    meta = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(),
        "commit": commit,
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    records = []
    for recipe in [] if a.only_backward else a.recipes:
        inputs = {}
        for b, hq, hkv, s, causal in SHAPES:
            q, k, v = make_qkv(b, hq, hkv, s, s, D, seed=2, device="cuda")
            inputs[(b, hq, hkv, s, causal)] = operands(recipe, q, k, v)
        variants = [(cfg, None) for cfg in CONFIGS]
        if recipe == "fp8":
            variants += [(cfg, 32) for cfg in CONFIGS if cfg[:4] == (64, 64, 4, 3) and cfg[4]]
        for cfg, imprecise in variants:
            rec_row = {
                "recipe": recipe,
                "block_m": cfg[0],
                "block_n": cfg[1],
                "warps": cfg[2],
                "stages": cfg[3],
                "split": cfg[4],
                "imprecise_k": imprecise if recipe == "fp8" else None,
            }
            saved = tb.IMPRECISE_K
            tb.IMPRECISE_K = imprecise
            try:
                rec_row["rel_l2"], rec_row["max_dlse"] = check(recipe, cfg)
                for (b, hq, hkv, s, causal), (rec, _, ops) in inputs.items():
                    ms = triton.testing.do_bench(
                        lambda: run_config(rec, ops, cfg, causal, s), warmup=50, rep=200, return_mode="median"
                    )
                    tf = 4 * b * hq * s * s * D / (2 if causal else 1) / ms / 1e9
                    rec_row[f"B{b} H{hq}/{hkv} S{s} {'causal' if causal else 'non-causal'} TFLOP/s"] = round(
                        tf, 1
                    )
            except Exception as e:  # noqa: BLE001  (a config that does not compile is a result)
                rec_row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            finally:
                tb.IMPRECISE_K = saved
            records.append(rec_row)
            print(json.dumps(rec_row), flush=True)

    bwd = backward_sweep(a.recipes) if a.backward else []

    # where the forward's quantization time goes (B4 H32/8 S4096)
    from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows
    from fp4_attention.backends.triton.quant_nvfp4 import quantize_nvfp4_rows
    from fp4_attention.backends.triton.quant_v import quantize_fp8_v_transposed
    from fp4_attention.numerics.quant import nvfp4_global_scale

    q, k, v = make_qkv(4, 32, 8, 4096, 4096, D, seed=3, device="cuda")
    steps = {
        "fp8 Q per-token (triton)": lambda: quantize_fp8_rows(q),
        "fp8 K per-token (triton)": lambda: quantize_fp8_rows(k),
        "fp8 V per-channel, transposed (amax + triton)": lambda: quantize_fp8_v_transposed(v),
        "nvfp4 Q global scale (torch amax)": lambda: nvfp4_global_scale(q, dims=(2, 3)),
        "nvfp4 Q blocks + decode (triton)": lambda: quantize_nvfp4_rows(
            q, nvfp4_global_scale(q, dims=(2, 3))
        ),
    }
    quant = (
        {}
        if a.only_backward
        else {
            name: round(triton.testing.do_bench(fn, warmup=20, rep=100, return_mode="median"), 4)
            for name, fn in steps.items()
        }
    )
    print(json.dumps({"quantization_ms": quant}), flush=True)

    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out + ".json").write_text(
        json.dumps({"meta": meta, "records": records, "backward": bwd, "quantization_ms": quant}, indent=1)
    )
    keys = [k for k in records[0] if k.endswith("TFLOP/s")] if records else []
    lines = [
        f"# Forward tile sweep, {meta['gpu']}",
        "",
        f"- date {meta['date']}, commit {commit}, torch {meta['torch']}, triton {meta['triton']}",
        "- kernel-only TFLOP/s (operands quantized outside the timed region); rel-L2 / max |dLSE| vs the "
        "reference on the same quantized operands (B2 H8/2 S300, causal and not)",
        "",
        "| recipe | BM | BN | warps | stages | split | imprecise | rel-L2 | max dLSE | "
        + " | ".join(keys)
        + " |",
        "|---" * (9 + len(keys)) + "|",
    ]
    for r in records:
        if "error" in r:
            lines.append(
                f"| {r['recipe']} | {r['block_m']} | {r['block_n']} | {r['warps']} | {r['stages']} | "
                f"{r['split']} | {r['imprecise_k']} | error: {r['error'][:80]} |"
            )
            continue
        lines.append(
            f"| {r['recipe']} | {r['block_m']} | {r['block_n']} | {r['warps']} | {r['stages']} | "
            f"{r['split']} "
            f"| {r['imprecise_k']} | {r['rel_l2']:.1e} | {r['max_dlse']:.1e} | "
            + " | ".join(str(r.get(k)) for k in keys)
            + " |"
        )
    if bwd:
        lines += [
            "",
            "Backward tiles (BLOCK_M, BLOCK_N, warps, stages) at B4 H32/8 S4096 causal: backward ms (dO "
            "quantization + both kernels), grads rel-L2 vs the default tiles",
            "",
            "| recipe | dK/dV tiles | dQ tiles | backward ms | max rel-L2 |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['recipe']} | {r['dkdv']} | {r['dq']} | {r.get('ms', r.get('error', ''))} | "
            f"{r.get('rel_l2', '')} |"
            for r in bwd
        ]
    lines += ["", "Quantization steps at B4 H32/8 S4096 (ms):", ""] + [
        f"- {k}: {v}" for k, v in quant.items()
    ]
    Path(a.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
