"""Attention throughput on one GPU: our recipes (Triton backend) against same-run baselines.

    python bench/attention_bench.py --out results/attention_bench_h200     # writes .json and .md

FLOPs = 4 * B * Hq * S^2 * D, halved for causal; forward + backward counts 3.5x the forward FLOPs.
Times are medians of ``triton.testing.do_bench`` (CUDA events) after warm-up, on inputs drawn
N(0, 1). Our forward times include the quantization of the BF16 Q/K/V (what a layer pays); the
"kernel only" column times the attention kernel on already-quantized operands, the fair
comparison with cuDNN's FP8 attention, which takes FP8 inputs with per-tensor scales.

``--qk-rotation`` adds, for ``fp8`` and ``nvfp4qk_fp8pv``, rows with the random-sign Hadamard
rotation of Q/K (``ours_<recipe>+hadamard``, forward and forward+backward) and the Q/K
quantization alone without and with it (``quant_qk_<recipe>``, ``quant_qk_<recipe>+hadamard``):
the rotation's cost is the difference of the ``ours_`` rows (or of the ``quant_qk_`` rows).

Baselines measured in the same run: cuDNN BF16 and FlashAttention-2 through torch SDPA backends
(GQA through ``enable_gqa``), and cuDNN FP8 attention through ``nvidia-cudnn-frontend``
(``sdpa_fp8`` / ``sdpa_fp8_backward``, per-tensor unit scales, P scaled by 256) when importable.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fp4_attention as fa
from fp4_attention.backends.triton import backend as triton_backend
from fp4_attention.numerics.recipes import ROTATION_RECIPES, with_qk_rotation

SHAPES = [  # (B, Hq, Hkv, S, causal, passes)
    (1, 32, 8, 4096, True, ("fwd", "fwd_bwd")),
    (4, 32, 8, 4096, True, ("fwd", "fwd_bwd")),
    (2, 32, 32, 8192, False, ("fwd",)),
    (1, 24, 24, 32768, False, ("fwd",)),
]
D = 128


def bench(fn, warmup=100, rep=400) -> float:
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def flops(b, hq, s, causal, pass_):
    f = 4 * b * hq * s * s * D / (2 if causal else 1)
    return f * (3.5 if pass_ == "fwd_bwd" else 1.0)


def sdpa_fn(backend, q, k, v, causal, pass_):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn_bf16": SDPBackend.CUDNN_ATTENTION, "fa2_bf16": SDPBackend.FLASH_ATTENTION}[backend]
    gqa = q.shape[1] != k.shape[1]
    dout = torch.randn_like(q)

    def fwd():
        with sdpa_kernel(be):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    if pass_ == "fwd":
        with torch.no_grad():
            fwd()
        return lambda: fwd()
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

    def fb():
        with sdpa_kernel(be):
            o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=gqa)
        o.backward(dout)

    fb()
    return fb


def quant_qk_fn(recipe, q, k):
    """The Triton backend's Q/K quantization alone (with the recipe's rotation, if any)."""
    return lambda: triton_backend._quantize_qk_fast(q, k, recipe)


def ours_fn(recipe, q, k, v, causal, pass_, backend="triton", **options):
    rec = fa.get_recipe(recipe)
    dout = torch.randn_like(q)
    if pass_ == "fwd":

        def f():
            with torch.no_grad():
                return fa.attention(
                    q, k, v, recipe=rec, causal=causal, layout="bhsd", backend=backend, **options
                )

        return f
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

    def fb():
        fa.attention(
            qg, kg, vg, recipe=rec, causal=causal, layout="bhsd", backend=backend, **options
        ).backward(dout)

    return fb


def cute_kernel_only(q, k, v, causal, tiles, **kernel_options):
    """The CuTe fp8 forward kernel alone on operands quantized (and V permuted) once outside."""
    from fp4_attention.backends.cute import backend as cute_backend

    ops = cute_backend.kernel_operands(*cute_backend.quantize_inputs(q, k, v), D**-0.5)

    def f():
        cute_backend.forward_fp8(*ops, causal=causal, tiles=tiles, **kernel_options)

    return f


def ours_kernel_only(recipe, q, k, v, causal):
    """Forward kernel alone on operands quantized once outside the timed region."""
    be = triton_backend.TritonBackend()
    rec = fa.get_recipe(recipe)
    _, _, st = be.forward(q, k, v, rec, causal=causal, softmax_scale=D**-0.5)
    ops = triton_backend.forward_operands(st.q, st.k, st.v, rec, q.shape, k.shape)

    def f():
        triton_backend.launch_forward(*ops, rec, causal=causal, softmax_scale=D**-0.5, seq_k=k.shape[2])

    return f


def cudnn_fp8_fn(q, k, v, causal, pass_):
    """cuDNN FP8 attention via cudnn-frontend: E4M3 Q/K/V/O, per-tensor unit scales, S scaled by 256."""
    import cudnn

    b, hq, s, d = q.shape
    f8 = torch.float8_e4m3fn
    q8, k8, v8 = (t.to(f8) for t in (q, k, v))
    one = torch.ones(1, 1, 1, 1, dtype=torch.float32, device=q.device)
    s256 = torch.full((1, 1, 1, 1), 256.0, device=q.device)
    ds256 = torch.full((1, 1, 1, 1), 1 / 256.0, device=q.device)
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.FP8_E4M3,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    tq, tk, tv = g.tensor_like(q8), g.tensor_like(k8), g.tensor_like(v8)
    t_one = {n: g.tensor_like(one) for n in ("dq", "dk", "dv", "so")}
    t_ds, t_s = g.tensor_like(ds256), g.tensor_like(s256)
    o, stats, amax_s, amax_o = g.sdpa_fp8(
        tq,
        tk,
        tv,
        t_one["dq"],
        t_one["dk"],
        t_one["dv"],
        t_ds,
        t_s,
        t_one["so"],
        is_inference=pass_ == "fwd",
        attn_scale=d**-0.5,
        use_causal_mask=causal,
    )
    o8 = torch.empty_like(q8)
    o.set_output(True).set_dim(list(o8.shape)).set_stride(list(o8.stride())).set_data_type(
        cudnn.data_type.FP8_E4M3
    )
    amax_s.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(
        cudnn.data_type.FLOAT
    )
    amax_o.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(
        cudnn.data_type.FLOAT
    )
    stats_t = None
    if pass_ != "fwd":
        stats_t = torch.empty(b, hq, s, 1, dtype=torch.float32, device=q.device)
        stats.set_output(True).set_dim(list(stats_t.shape)).set_stride(list(stats_t.stride())).set_data_type(
            cudnn.data_type.FLOAT
        )
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    amax_buf = [torch.empty(1, 1, 1, 1, device=q.device) for _ in range(2)]
    ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=q.device)
    pack = {
        tq: q8,
        tk: k8,
        tv: v8,
        t_ds: ds256,
        t_s: s256,
        o: o8,
        amax_s: amax_buf[0],
        amax_o: amax_buf[1],
        **{t: one for t in t_one.values()},
    }
    if stats_t is not None:
        pack[stats] = stats_t

    def fwd():
        g.execute(pack, ws)

    fwd()
    if pass_ == "fwd":
        return fwd
    # backward graph
    gb = cudnn.pygraph(
        io_data_type=cudnn.data_type.FP8_E4M3,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
    )
    do8 = torch.randn_like(q).to(torch.float8_e5m2)
    bq, bk, bv, bo = gb.tensor_like(q8), gb.tensor_like(k8), gb.tensor_like(v8), gb.tensor_like(o8)
    bdo, bst = gb.tensor_like(do8), gb.tensor_like(stats_t)
    sc = {n: gb.tensor_like(one) for n in ("dq", "dk", "dv", "do", "ddo", "ddp", "sdq", "sdk", "sdv", "sdp")}
    bds, bs = gb.tensor_like(ds256), gb.tensor_like(s256)
    dq, dk, dv, a1, a2, a3, a4 = gb.sdpa_fp8_backward(
        bq,
        bk,
        bv,
        bo,
        bdo,
        bst,
        sc["dq"],
        sc["dk"],
        sc["dv"],
        sc["do"],
        sc["ddo"],
        bds,
        sc["ddp"],
        bs,
        sc["sdq"],
        sc["sdk"],
        sc["sdv"],
        sc["sdp"],
        attn_scale=d**-0.5,
        use_causal_mask=causal,
    )
    outs = {
        dq: torch.empty_like(q, dtype=torch.float8_e5m2),
        dk: torch.empty_like(k, dtype=torch.float8_e5m2),
        dv: torch.empty_like(v, dtype=torch.float8_e5m2),
    }
    for t, buf in outs.items():
        t.set_output(True).set_dim(list(buf.shape)).set_stride(list(buf.stride())).set_data_type(
            cudnn.data_type.FP8_E5M2
        )
    amaxes = {}
    for a in (a1, a2, a3, a4):
        a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(cudnn.data_type.FLOAT)
        amaxes[a] = torch.empty(1, 1, 1, 1, device=q.device)
    gb.validate()
    gb.build_operation_graph()
    gb.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    gb.check_support()
    gb.build_plans()
    wsb = torch.empty(gb.get_workspace_size(), dtype=torch.uint8, device=q.device)
    packb = {
        bq: q8,
        bk: k8,
        bv: v8,
        bo: o8,
        bdo: do8,
        bst: stats_t,
        bds: ds256,
        bs: s256,
        **outs,
        **amaxes,
        **{t: one for t in sc.values()},
    }

    def fb():
        g.execute(pack, ws)
        gb.execute(packb, wsb)

    fb()
    return fb


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None)
    p.add_argument("--recipes", nargs="+", default=list(fa.TRAINING_RECIPES))
    p.add_argument("--shapes", type=int, nargs="*", default=None, help="indices into SHAPES")
    p.add_argument("--cute", action="store_true", help="add the cute fp8 backend and the FA4 BF16 control")
    p.add_argument(
        "--qk-rotation",
        action="store_true",
        help="add the rows with the Hadamard Q/K rotation and the Q/K quantization cost with and without it",
    )
    p.add_argument(
        "--cute-tiles",
        nargs="*",
        default=["128,128,2"],
        help="tile_m,tile_n,stages of the cute kernel to time (kernel only); the first is used "
        "for the full forward / fwd+bwd rows",
    )
    args = p.parse_args(argv)
    torch.manual_seed(0)
    commit = (
        os.environ.get("BENCH_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        or "unknown"
    )
    meta = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(),
        "commit": commit,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "flops": "4*B*Hq*S^2*D, /2 causal, x3.5 fwd+bwd",
    }
    records = []
    shapes = [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES
    for b, hq, hkv, s, causal, passes in shapes:
        q = torch.randn(b, hq, s, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16)
        shape = f"B{b} H{hq}/{hkv} S{s} {'causal' if causal else 'non-causal'}"
        for pass_ in passes:
            base = {}
            cands = [
                ("cudnn_bf16", lambda: sdpa_fn("cudnn_bf16", q, k, v, causal, pass_)),
                ("fa2_bf16", lambda: sdpa_fn("fa2_bf16", q, k, v, causal, pass_)),
                ("cudnn_fp8", lambda: cudnn_fp8_fn(q, k, v, causal, pass_)),
            ]
            cands += [(f"ours_{r}", (lambda r=r: ours_fn(r, q, k, v, causal, pass_))) for r in args.recipes]
            if args.qk_rotation:
                rotated = [with_qk_rotation(r, "hadamard") for r in args.recipes if r in ROTATION_RECIPES]
                cands += [
                    (f"ours_{r.name}+hadamard", (lambda r=r: ours_fn(r, q, k, v, causal, pass_)))
                    for r in rotated
                ]
                if pass_ == "fwd":
                    for r in rotated:
                        plain = fa.get_recipe(r.name)
                        cands += [
                            (f"quant_qk_{plain.name}", (lambda p=plain: quant_qk_fn(p, q, k))),
                            (f"quant_qk_{r.name}+hadamard", (lambda r=r: quant_qk_fn(r, q, k))),
                        ]
            if pass_ == "fwd":
                cands += [
                    (f"ours_{r}_kernel_only", (lambda r=r: ours_kernel_only(r, q, k, v, causal)))
                    for r in args.recipes
                    if r != "bf16"
                ]
            if args.cute:
                tiles = [tuple(int(x) for x in t.split(",")) for t in args.cute_tiles]
                cands += [
                    ("fa4_bf16", lambda: ours_fn("bf16", q, k, v, causal, pass_, backend="fa4")),
                    (
                        "cute_fp8",
                        lambda: ours_fn("fp8", q, k, v, causal, pass_, backend="cute", tiles=tiles[0]),
                    ),
                ]
                if pass_ == "fwd":
                    cands += [
                        (
                            f"cute_fp8_kernel_only_t{t[0]}x{t[1]}s{t[2]}",
                            (lambda t=t: cute_kernel_only(q, k, v, causal, t)),
                        )
                        for t in tiles
                    ]
                    # measurement options of the kernel (cute_fwd_sm90.FP8ForwardSm90): "early" = the
                    # K scales loaded before the QK product and the first two k32 QK products in
                    # flight together (same numerics as the default); then the warp-scheduler turn
                    # for the PV issue only; Direct-P (2^x of one column in 4 on the FMA pipe);
                    # QK promotion per 64 or none; FA3's intra-warpgroup
                    # overlap (QK chained), the last also without the PV promotion
                    t0 = tiles[0]
                    early = dict(early_k_scales=True, qk_pair_issue=True)
                    for tag, opts in (
                        ("early", early),
                        ("early_pv_only_turn", dict(early, pv_only_turn=True)),
                        ("early_direct_p4", dict(early, exp2_fma_every=4)),
                        ("early_qk_promote64", dict(early, qk_promote_k=64)),
                        ("early_qk_chained", dict(early_k_scales=True, promote_qk=False)),
                        ("overlap_qk_chained", dict(intra_wg_overlap=True, promote_qk=False)),
                        (
                            "overlap_unpromoted",
                            dict(intra_wg_overlap=True, promote_qk=False, promote_pv=False),
                        ),
                    ):
                        cands.append(
                            (
                                f"cute_fp8_kernel_only_t{t0[0]}x{t0[1]}s{t0[2]}_{tag}",
                                (lambda opts=opts: cute_kernel_only(q, k, v, causal, t0, **opts)),
                            )
                        )
            for name, make in cands:
                rec = {
                    "shape": shape,
                    "B": b,
                    "Hq": hq,
                    "Hkv": hkv,
                    "S": s,
                    "D": D,
                    "causal": causal,
                    "pass": pass_,
                    "impl": name,
                }
                try:
                    fn = make()
                    ms = bench(fn)
                    rec.update(ms=ms)
                    if not name.startswith("quant_qk_"):  # a quantization alone has no attention FLOPs
                        rec.update(tflops=flops(b, hq, s, causal, pass_) / ms / 1e9)
                except Exception as e:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
                    rec.update(error=f"{type(e).__name__}: {str(e)[:300]}")
                    traceback.print_exc(limit=2)
                base[name] = rec
                records.append(rec)
                torch.cuda.empty_cache()
            ref = base["cudnn_bf16"].get("tflops")
            for rec in base.values():
                for other in ("cudnn_bf16", "fa4_bf16", "cudnn_fp8"):
                    o = base.get(other, {}).get("tflops")
                    if o and "tflops" in rec:
                        rec[f"vs_{other}"] = rec["tflops"] / o
                rec["same_run_cudnn_bf16_tflops"] = ref
                print(json.dumps(rec), flush=True)
    if args.cute:
        from importlib.metadata import version

        from fp4_attention.backends.cute import backend as cute_backend

        meta["versions"] = {p: version(p) for p in ("nvidia-cutlass-dsl", "flash-attn-4", "quack-kernels")}
        meta["cute_first_call_compile_s"] = {
            f"d{k[0]} g{k[1]} {'causal' if k[2] else 'non-causal'} tiles{k[3]}": round(v, 2)
            for k, v in cute_backend.COMPILE_SECONDS.items()
        }
    md = to_markdown(records, meta)
    print(md)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
        Path(args.out + ".md").write_text(md)
    return 0


def to_markdown(records, meta) -> str:
    lines = [
        f"# Attention throughput, {meta['gpu']}",
        "",
        f"- date {meta['date']}, commit {meta['commit']}, torch {meta['torch']}, triton {meta['triton']}, "
        f"cuDNN {meta['cudnn']}",
        f"- TFLOP/s with FLOPs = {meta['flops']}; median of CUDA-event timings; "
        "baselines measured in the same run; `ours_*` forward includes quantizing BF16 Q/K/V, "
        "`*_kernel_only` does not (cuDNN FP8 takes FP8 inputs)",
        *(
            [f"- cute first-call compile seconds: {meta['cute_first_call_compile_s']}"]
            if "cute_first_call_compile_s" in meta
            else []
        ),
        "",
        "| shape | pass | impl | ms | TFLOP/s | vs cuDNN BF16 | vs FA4 BF16 | vs cuDNN FP8 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "error" in r:
            lines.append(
                f"| {r['shape']} | {r['pass']} | {r['impl']} | - | error: {r['error'][:80]} | - | - | - |"
            )
        else:
            lines.append(
                f"| {r['shape']} | {r['pass']} | {r['impl']} | {r['ms']:.3f} | "
                + (f"{r['tflops']:.0f}" if "tflops" in r else "-")
                + " | "
                + " | ".join(
                    f"{r[k]:.2f}x" if k in r else "-"
                    for k in ("vs_cudnn_bf16", "vs_fa4_bf16", "vs_cudnn_fp8")
                )
                + " |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
