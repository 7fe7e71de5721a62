"""Attention throughput on one GPU: our recipes (Triton backend) against same-run baselines.

    python bench/attention_bench.py --out results/attention_bench_h200     # writes .json and .md

FLOPs = 4 * B * Hq * S^2 * D, halved for causal; forward + backward counts 3.5x the forward FLOPs,
the backward alone ("bwd": the forward run once outside the timed region, then
``out.backward(dout, retain_graph=True)``, or the cuDNN FP8 backward graph) 2.5x.
Times are medians of ``triton.testing.do_bench`` (CUDA events) after warm-up, on inputs drawn
N(0, 1). Our forward times include the quantization of the BF16 Q/K/V (what a layer pays); the
"kernel only" column times the attention kernel on already-quantized operands, the fair
comparison with cuDNN's FP8 attention, which takes FP8 inputs with per-tensor scales.

``--qk-rotation`` adds, for ``fp8`` and ``nvfp4qk_fp8pv``, rows with the random-sign Hadamard
rotation of Q/K (``ours_<recipe>+hadamard``, forward and forward+backward) and the Q/K
quantization alone without and with it (``quant_qk_<recipe>``, ``quant_qk_<recipe>+hadamard``):
the rotation's cost is the difference of the ``ours_`` rows (or of the ``quant_qk_`` rows).

``--graphed`` adds forward+backward rows ``<impl>_graphed`` (``GRAPHED``): the same step captured in
one CUDA graph and replayed, i.e. its kernels without the host's launch cost. Where the eager row is
bound by the host (B1), the pair separates the two; inside a model the host usually runs ahead.
An implementation that cannot be captured reports its error in its row (on the H200 at e9713d6 all
of ``GRAPHED`` were captured: ``results/cute_graphed_h200``). cuDNN FP8 is not in ``GRAPHED``.
With ``--rounds`` above 1 every graph of a shape is alive while the others are captured and the
eager rows run (``graphed`` keeps each step's tensors alive for its graph).

``--rope`` adds forward and forward+backward rows ``<impl>+rope`` with RoPE applied to Q and K
(Llama's angles, tables built once outside the timed region, as a training step builds them once):
ours through ``attention(..., rope=...)``, where the triton and cute backends apply it inside the
``fp8`` Q/K quantizer (``backends/triton/rope.py``) and RoPE's gradient after the backward; the BF16
baselines (``cudnn_bf16+rope``, ``fa4_bf16+rope``) with RoPE as its own pass before the kernel (our
Triton RoPE kernel, ``rope_rows_pair``: one read and one write of Q and K in one launch, and its
transposed rotation on dQ/dK, also one launch). Their ``vs`` columns compare with the ``+rope`` baselines.

Baselines measured in the same run: cuDNN BF16 and FlashAttention-2 through torch SDPA backends
(GQA through ``enable_gqa``), and cuDNN FP8 attention through ``nvidia-cudnn-frontend``
(``sdpa_fp8`` / ``sdpa_fp8_backward``, per-tensor unit scales, P scaled by 256) when importable.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fp4_attention as fa
from fp4_attention.backends.rope import RoPEFunction, rope_pair_op
from fp4_attention.backends.triton import backend as triton_backend
from fp4_attention.numerics.recipes import ROTATION_RECIPES, with_qk_rotation
from tools.fidelity import parse_recipe

SHAPES = [  # (B, Hq, Hkv, S, causal, passes)
    (1, 32, 8, 4096, True, ("fwd", "fwd_bwd")),
    (4, 32, 8, 4096, True, ("fwd", "fwd_bwd", "bwd")),
    (2, 32, 32, 8192, False, ("fwd", "fwd_bwd", "bwd")),
    (1, 24, 24, 32768, False, ("fwd",)),
]
D = 128


def bench(fn, warmup=100, rep=400) -> float:
    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def time_rows(cands, meta_row: dict, rounds: int = 1) -> list[dict]:
    """One record per ``(name, make)`` of ``cands`` (``make()`` builds the timed callable): ``ms``,
    the median over ``rounds`` of :func:`bench`'s median, and ``t_unix``, the Unix seconds each
    round's timing ran between (to set a row against the clocks sampled beside the bench:
    ``bench/cute_session.sh``'s ``bench_clocks.csv``, ``bench/bench_clocks.py``). With one round each
    callable is built, timed and dropped in turn; with more, all are built first and the rounds go
    over them in order, so that every row meets the GPU's clock and power states in turn (the H100's
    SM clock moved by up to a quarter within a run under its power cap,
    ``results/session_2026-12-05d_h100``). A row whose build or timing raises gets ``error`` instead
    (a baseline that cannot run is reported, not fatal)."""
    recs, fns = [], []
    for name, make in cands:
        rec = {**meta_row, "impl": name}
        try:
            fns.append(make())
        except Exception as e:  # noqa: BLE001
            rec.update(error=f"{type(e).__name__}: {str(e)[:300]}")
            traceback.print_exc(limit=2)
            fns.append(None)
        if rounds == 1 and fns[-1] is not None:
            _time_round(rec, fns[-1])
            fns[-1] = None
            torch.cuda.empty_cache()
        recs.append(rec)
    if rounds > 1:  # one round timed each row above already
        for _ in range(rounds):
            for rec, fn in zip(recs, fns):
                if fn is not None and "error" not in rec:
                    _time_round(rec, fn)
    for rec in recs:
        if "ms_rounds" in rec:
            rec["ms"] = statistics.median(rec["ms_rounds"])
            if rounds == 1:
                del rec["ms_rounds"]
                rec["t_unix"] = rec["t_unix"][0]
    torch.cuda.empty_cache()
    return recs


def _time_round(rec: dict, fn) -> None:
    """One :func:`bench` of ``fn`` into ``rec``'s ``ms_rounds`` and ``t_unix`` (or ``error``)."""
    try:
        t0 = time.time()
        ms = bench(fn)
        rec.setdefault("ms_rounds", []).append(ms)
        rec.setdefault("t_unix", []).append([round(t0, 2), round(time.time(), 2)])
    except Exception as e:  # noqa: BLE001
        rec.update(error=f"{type(e).__name__}: {str(e)[:300]}")
        traceback.print_exc(limit=2)


def graphed(fn, warmup: int = 3):
    """``fn`` captured in one CUDA graph (after ``warmup`` eager calls on a side stream, as
    ``torch.cuda.graph`` asks) and returned as the graph's replay: the step's kernels without the
    host's launch cost. A step inside a larger model, whose host runs ahead of the GPU, or a
    CUDA-graphed step sees this time; the eager rows measure the host where it bounds (B1).

    The replay holds ``fn``, and through it the tensors its closure owns (dO, the leaves whose
    ``.grad`` the step accumulates into, allocated before the capture, outside the graph's pool):
    the graph's kernels read and write them at their captured addresses. Without that reference
    they were freed when ``graphed`` returned, and the next capture's ``torch.cuda.graph``, which
    empties the allocator's cache first, released them to the driver: replaying the earlier graph
    then raised an illegal memory access (``results/session_2026-12-05g_h100``)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()

    def replay():
        graph.replay()

    replay.step = fn  # kept alive as long as the replay (see above)
    return replay


GRAPHED = ("cudnn_bf16", "fa4_bf16", "cute_fp8", "cute_nvfp4qk_fp8pv", "ours_fp8", "ours_nvfp4qk_fp8pv")


def flops(b, hq, s, causal, pass_):
    f = 4 * b * hq * s * s * D / (2 if causal else 1)
    return f * {"fwd": 1.0, "fwd_bwd": 3.5, "bwd": 2.5}[pass_]


def rope_tables_for(s: int) -> fa.RoPETables:
    """Llama-3's RoPE tables (base 500000, no frequency scaling) for positions 0..s-1 at head dim D."""
    inv = 500000.0 ** (-torch.arange(0, D, 2, dtype=torch.float32, device="cuda") / D)
    return fa.RoPETables.from_angles(torch.arange(s, dtype=torch.float32, device="cuda")[:, None] * inv)


def sdpa_fn(backend, q, k, v, causal, pass_, rope=None):
    """torch SDPA with ``backend``; with ``rope`` (tables) RoPE runs first as its own pass
    (``rope_pair_op``: Q and K in one launch, and ``RoPEFunction`` under autograd: its transposed
    rotation in the backward, one launch for dQ and dK)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn_bf16": SDPBackend.CUDNN_ATTENTION, "fa2_bf16": SDPBackend.FLASH_ATTENTION}[backend]
    gqa = q.shape[1] != k.shape[1]
    dout = torch.randn_like(q)

    def roped(a, b, grad):
        if rope is None:
            return a, b
        return RoPEFunction.apply(a, b, rope) if grad else rope_pair_op(a, b, rope)

    def fwd():
        qr, kr = roped(q, k, False)
        with sdpa_kernel(be):
            return torch.nn.functional.scaled_dot_product_attention(
                qr, kr, v, is_causal=causal, enable_gqa=gqa
            )

    if pass_ == "fwd":
        with torch.no_grad():
            fwd()
        return lambda: fwd()
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

    def fb():
        qr, kr = roped(qg, kg, True)
        with sdpa_kernel(be):
            o = torch.nn.functional.scaled_dot_product_attention(qr, kr, vg, is_causal=causal, enable_gqa=gqa)
        if pass_ == "bwd":
            return lambda: o.backward(dout, retain_graph=True)
        o.backward(dout)

    bwd = fb()
    return bwd if pass_ == "bwd" else fb


def quant_qk_fn(recipe, q, k):
    """The Triton backend's Q/K quantization alone (with the recipe's rotation, if any)."""
    return lambda: triton_backend._quantize_qk_fast(q, k, recipe)


def ours_fn(recipe, q, k, v, causal, pass_, backend="triton", **options):
    """``fa.attention`` on ``backend``; ``options`` go to it (``rope``: tables, and backend options)."""
    rec = parse_recipe(recipe, 0)
    dout = torch.randn_like(q)
    if pass_ == "fwd":

        def f():
            with torch.no_grad():
                return fa.attention(
                    q, k, v, recipe=rec, causal=causal, layout="bhsd", backend=backend, **options
                )

        return f
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    if pass_ == "bwd":
        o = fa.attention(qg, kg, vg, recipe=rec, causal=causal, layout="bhsd", backend=backend, **options)
        return lambda: o.backward(dout, retain_graph=True)

    def fb():
        fa.attention(
            qg, kg, vg, recipe=rec, causal=causal, layout="bhsd", backend=backend, **options
        ).backward(dout)

    return fb


# --cute-fwd-options: FP8ForwardSm90's measurement options
FWD_OPTIONS = ("k64",)


def cute_kernel_only(q, k, v, causal, tiles, **kernel_options):
    """The CuTe fp8 forward kernel alone on operands quantized (and V permuted) once outside; with the
    kernel option ``k_group``, K quantized with one scale per that many keys (torch, untimed)."""
    from fp4_attention.backends.cute import backend as cute_backend
    from fp4_attention.numerics.quant import quantize_fp8_key_groups

    q_s, k_s, v_s = cute_backend.quantize_inputs(q, k, v)
    if kernel_options.get("k_group"):
        k_s = quantize_fp8_key_groups(k, kernel_options["k_group"])
    ops = cute_backend.kernel_operands(q_s, k_s, v_s, D**-0.5)

    def f():
        cute_backend.forward_fp8(*ops, causal=causal, tiles=tiles, **kernel_options)

    return f


def cute_nvfp4_kernel_only(q, k, v, causal, tiles, **kernel_options):
    """The CuTe ``nvfp4qk_fp8pv`` forward kernel (BF16 QK on the NVFP4 decode, FP8 PV) alone on
    operands quantized and decoded once outside (``quantize_nvfp4_inputs``, as ``CuteBackend.forward``)."""
    from fp4_attention.backends.cute import backend as cute_backend

    q_s, k_s, v_s, decoded = cute_backend.quantize_nvfp4_inputs(q, k, v)
    ops = cute_backend.kernel_operands(q_s, k_s, v_s, D**-0.5, decoded)

    def f():
        cute_backend.forward_fp8(*ops, causal=causal, tiles=tiles, qk_bf16=True, **kernel_options)

    return f


def _cute_state(recipe, q, k, v, causal):
    """One cute forward's saved state and a random BF16 dO, for the backward rows that skip autograd."""
    from fp4_attention.backends.cute import backend as cute_backend

    rec = parse_recipe(recipe, 0)
    _, _, st = cute_backend.CuteBackend().forward(q, k, v, rec, causal=causal, softmax_scale=D**-0.5)
    return st, torch.randn_like(q)


def cute_bwd_operands_only(q, k, v, causal):
    """The cute backward's host-side operand preparation alone (``backend.backward_operands``: dO's
    E5M2 quantization and D, dO^T, the BF16 Q/K images, V in key order), on one forward's state."""
    from fp4_attention.backends.cute import backend as cute_backend

    st, dout = _cute_state("fp8", q, k, v, causal)
    return lambda: cute_backend.backward_operands(st, dout, D**-0.5)


def cute_bwd_direct(recipe, q, k, v, causal):
    """The cute backward (``backend.backward_fp8``: operands, kernel, postprocess) called directly on
    one forward's state, without autograd."""
    from fp4_attention.backends.cute import backend as cute_backend

    st, dout = _cute_state(recipe, q, k, v, causal)
    return lambda: cute_backend.backward_fp8(st, dout, causal=causal, softmax_scale=D**-0.5)


def fa4_bwd_direct(q, k, v, causal):
    """FA4 BF16's backward (``FA4Backend.backward``: its preprocess, kernel and postprocess) called
    directly on one forward's state, without autograd: the counterpart of :func:`cute_bwd_direct`.
    Through autograd (the ``bwd`` rows) each call also adds the gradients into the inputs' ``.grad``
    (about 0.6 GB of traffic at B4 H32/8 S4096 D128), which a direct call does not."""
    from fp4_attention.backends.fa4.backend import FA4Backend

    rec = parse_recipe("bf16", 0)
    be = FA4Backend()
    _, _, st = be.forward(q, k, v, rec, causal=causal, softmax_scale=D**-0.5)
    dout = torch.randn_like(q)
    return lambda: be.backward(st, dout, rec, causal=causal, softmax_scale=D**-0.5)


def ours_kernel_only(recipe, q, k, v, causal):
    """Forward kernel alone on operands quantized once outside the timed region."""
    be = triton_backend.TritonBackend()
    rec = parse_recipe(recipe, 0)
    _, _, st = be.forward(q, k, v, rec, causal=causal, softmax_scale=D**-0.5)
    ops = triton_backend.forward_operands(st.q, st.k, st.v, rec, q.shape, k.shape)

    def f():
        triton_backend.launch_forward(*ops, rec, causal=causal, softmax_scale=D**-0.5, seq_k=k.shape[2])

    return f


def cudnn_fp8_fn(q, k, v, causal, pass_):
    """cuDNN FP8 attention via cudnn-frontend (``tools/cudnn_fp8.py``): E4M3 Q/K/V/O, E5M2 dO and
    gradients, per-tensor unit scales, P scaled by 256."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from cudnn_fp8 import CudnnFP8Attention

    b, hq, s, d = q.shape
    att = CudnnFP8Attention(b, hq, k.shape[1], s, d, causal, training=pass_ != "fwd")
    for name, t in (("q8", q), ("k8", k), ("v8", v)):
        getattr(att, name).copy_(t.to(torch.float8_e4m3fn))
    att.set_scales(scale_s=256.0, descale_s=1 / 256.0)
    att.forward()
    if pass_ == "fwd":
        return att.forward
    att.do8.copy_(torch.randn_like(q).to(torch.float8_e5m2))
    att.backward()
    if pass_ == "bwd":
        return att.backward

    def fb():
        att.forward()
        att.backward()

    return fb


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None)
    p.add_argument(
        "--recipes",
        nargs="+",
        default=list(fa.TRAINING_RECIPES),
        help="training recipes, with tools/fidelity.py's suffixes: fp8+k64 (K scales per 64 keys: rows "
        "ours_fp8+k64, cute_fp8+k64), NAME+hadamard",
    )
    p.add_argument("--shapes", type=int, nargs="*", default=None, help="indices into SHAPES")
    p.add_argument(
        "--passes",
        nargs="+",
        choices=("fwd", "fwd_bwd", "bwd"),
        default=None,
        help="time only these passes of each shape (default: each shape's passes in SHAPES)",
    )
    p.add_argument("--cute", action="store_true", help="add the cute fp8 backend and the FA4 BF16 control")
    p.add_argument(
        "--cute-fwd-options",
        nargs="*",
        choices=FWD_OPTIONS,
        default=None,
        help="also time the cute forward's measurement options, kernel only: k64 (k_group=64, K per "
        "64 keys); no names: all",
    )
    p.add_argument(
        "--cute-bwd-options",
        action="store_true",
        help="bwd rows cute_<recipe>_bwd_direct and fa4_bf16_bwd_direct: the backwards without autograd",
    )
    p.add_argument(
        "--qk-rotation",
        action="store_true",
        help="add the rows with the Hadamard Q/K rotation and the Q/K quantization cost with and without it",
    )
    p.add_argument(
        "--rope",
        action="store_true",
        help="add fwd and fwd+bwd rows <impl>+rope: RoPE inside our attention, as its own pass before the "
        "BF16 baselines (cudnn_bf16, and fa4_bf16 with --cute)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time each (shape, pass) group's rows this many times, round-robin, and report the median "
        "(ms_rounds: each round's; the callables are all built first). Default 1: each row timed once",
    )
    p.add_argument(
        "--graphed",
        action="store_true",
        help="add fwd+bwd rows <impl>_graphed (one CUDA graph replayed: no host launch cost) for "
        + ", ".join(GRAPHED),
    )
    p.add_argument(
        "--cute-tiles",
        nargs="*",
        default=None,
        help="tile_m,tile_n,stages of the cute kernel to time (kernel only); default the backend's "
        "default tiles (cute.backend.default_tiles of the head dim), which the full forward / "
        "fwd+bwd rows always run",
    )
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    tiles = None  # the cute forward's tiles of the kernel-only rows, parsed once
    if args.cute and args.cute_tiles is None:
        from fp4_attention.backends.cute.backend import default_tiles

        tiles = [default_tiles(D)]
    elif args.cute:
        tiles = [tuple(int(x) for x in t.split(",")) for t in args.cute_tiles]
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
            if args.passes and pass_ not in args.passes:
                continue
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
                cands += [
                    ("fa4_bf16", lambda: ours_fn("bf16", q, k, v, causal, pass_, backend="fa4")),
                    *[
                        (
                            f"cute_{r}",
                            (lambda r=r: ours_fn(r, q, k, v, causal, pass_, backend="cute")),
                        )
                        for r in args.recipes
                        if parse_recipe(r, 0).name in ("fp8", "nvfp4qk_fp8pv")
                    ],
                ]
                if pass_ == "bwd":
                    cands.append(
                        ("cute_fp8_bwd_operands_only", lambda: cute_bwd_operands_only(q, k, v, causal))
                    )
                if pass_ == "bwd" and args.cute_bwd_options:
                    cands.append(("fa4_bf16_bwd_direct", lambda: fa4_bwd_direct(q, k, v, causal)))
                    cands += [
                        (f"cute_{r}_bwd_direct", (lambda r=r: cute_bwd_direct(r, q, k, v, causal)))
                        for r in args.recipes
                        if r in ("fp8", "nvfp4qk_fp8pv")
                    ]
                if pass_ == "fwd":
                    cands += [
                        (
                            f"cute_fp8_kernel_only_t{t[0]}x{t[1]}s{t[2]}",
                            (lambda t=t: cute_kernel_only(q, k, v, causal, t)),
                        )
                        for t in tiles
                    ]
                    if "nvfp4qk_fp8pv" in args.recipes:
                        cands += [
                            (
                                f"cute_nvfp4qk_fp8pv_kernel_only_t{t[0]}x{t[1]}s{t[2]}",
                                (lambda t=t: cute_nvfp4_kernel_only(q, k, v, causal, t)),
                            )
                            for t in tiles
                        ]
                fwd_options = args.cute_fwd_options
                fwd_options = set() if fwd_options is None else set(fwd_options or FWD_OPTIONS)
                if pass_ == "fwd" and "k64" in fwd_options:
                    # one K scale per 64 keys, folded into the row factor (the K-scale decision)
                    cands += [
                        (
                            f"cute_fp8_kernel_only_t{t[0]}x{t[1]}s{t[2]}_k64",
                            (lambda t=t: cute_kernel_only(q, k, v, causal, t, k_group=64)),
                        )
                        for t in tiles
                        if t[1] % 64 == 0
                    ]
            if args.rope and pass_ in ("fwd", "fwd_bwd"):
                tables = rope_tables_for(s)
                cands.append(
                    ("cudnn_bf16+rope", lambda: sdpa_fn("cudnn_bf16", q, k, v, causal, pass_, tables))
                )
                cands += [
                    (f"ours_{r}+rope", (lambda r=r: ours_fn(r, q, k, v, causal, pass_, rope=tables)))
                    for r in args.recipes
                ]
                if args.cute:
                    cands.append(
                        (
                            "fa4_bf16+rope",
                            lambda: ours_fn("bf16", q, k, v, causal, pass_, backend="fa4", rope=tables),
                        )
                    )
                    cands += [
                        (
                            f"cute_{r}+rope",
                            (lambda r=r: ours_fn(r, q, k, v, causal, pass_, backend="cute", rope=tables)),
                        )
                        for r in args.recipes
                        if parse_recipe(r, 0).name in ("fp8", "nvfp4qk_fp8pv")
                    ]
            if args.graphed and pass_ == "fwd_bwd":
                cands += [
                    (f"{name}_graphed", (lambda make=make: graphed(make())))
                    for name, make in cands
                    if name in GRAPHED
                ]
            meta_row = {
                "shape": shape,
                "B": b,
                "Hq": hq,
                "Hkv": hkv,
                "S": s,
                "D": D,
                "causal": causal,
                "pass": pass_,
            }
            for rec in time_rows(cands, meta_row, args.rounds):
                if "ms" in rec and not rec["impl"].startswith("quant_qk_"):  # a quantization has no FLOPs
                    rec.update(tflops=flops(b, hq, s, causal, pass_) / rec["ms"] / 1e9)
                base[rec["impl"]] = rec
                records.append(rec)
            ref = base["cudnn_bf16"].get("tflops")
            for name, rec in base.items():
                for other in ("cudnn_bf16", "fa4_bf16", "cudnn_fp8"):
                    # a +rope row against the same baseline with RoPE (none for cuDNN FP8)
                    o = base.get(other + "+rope" if name.endswith("+rope") else other, {}).get("tflops")
                    if o and "tflops" in rec:
                        rec[f"vs_{other}"] = rec["tflops"] / o
                rec["same_run_cudnn_bf16_tflops"] = ref
                print(json.dumps(rec), flush=True)
    if args.cute:
        from importlib.metadata import version

        from fp4_attention.backends.cute import backend as cute_backend

        meta["versions"] = {p: version(p) for p in ("nvidia-cutlass-dsl", "flash-attn-4", "quack-kernels")}
        meta["cute_first_call_compile_s"] = compile_labels(cute_backend.COMPILE_SECONDS)
        # kernels loaded from a kernel cache (a prebuilt one: tools/prebuild_cute_kernels.py) were not
        # compiled in this run and have no entry above
        meta["cute_kernel_cache"] = os.environ.get("FP4_ATTENTION_CUTE_CACHE_DIR") or None
    md = to_markdown(records, meta)
    print(md)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
        Path(args.out + ".md").write_text(md)
    return 0


def compile_labels(compile_seconds: dict) -> dict:
    """The cute backend's first-call compile seconds (``backend.COMPILE_SECONDS``) by readable kernel
    label, rounded to 0.01 s: ``bwd d128 g4 causal`` (with `` qk_bf16`` for nvfp4qk_fp8pv's) and
    ``fwd d128 g4 causal tiles(128, 128, 2)`` plus the forward's kernel options that are set
    (``k_group=64``, ``qk_bf16=True``): each is its own kernel, so each gets its own entry."""
    labels = {}
    for k, v in compile_seconds.items():
        if k[0] == "bwd":
            label = f"bwd d{k[1]} g{k[2]} {'causal' if k[3] else 'non-causal'}" + "".join(
                f" {o}" for o in k[4:]
            )
        else:
            label = f"fwd d{k[0]} g{k[1]} {'causal' if k[2] else 'non-causal'} tiles{k[3]}"
            label += "".join(f" {name}={value}" for name, value in k[4] if value)
        labels[label] = round(v, 2)
    return labels


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
            [
                f"- cute first-call compile seconds: {meta['cute_first_call_compile_s']}"
                + (
                    f" (kernel cache {meta['cute_kernel_cache']}: kernels loaded from it were not compiled)"
                    if meta.get("cute_kernel_cache")
                    else ""
                )
            ]
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
