"""Bandwidth of the forward's Q/K/V quantizers on one GPU, against a device-to-device copy measured in
the same run (the roofline: each quantizer's fewest bytes, inputs read once and outputs written
once, over the copy's bytes per second), with a sweep of the row kernels' launch options.

    python bench/quant_bench.py --out results/quant_bench_h200        # writes .json and .md
    python bench/quant_bench.py --shapes "K B4 H8 S4096" "Q B1 H32 S4096" "K B4 H8 S4096" --kinds fp8_rows

Rows (BF16 inputs ``[B, H, S, D]``, D = 128, contiguous):
- ``fp8 rows`` (``quantize_fp8_rows``, Q or K per token): reads 2 B/element, writes 1 B/element and
  4 B/row; every (rows per program, warps) of the sweep; the bytes checked equal to the default's.
- ``nvfp4 heads`` (``quantize_nvfp4_heads``, nvfp4qk_fp8pv's Q/K): the amax pass reads 2 B/element,
  the rows pass reads 2 and writes 0.5 + 1/16 (payload, block scales) + 2 (the BF16 decode) B/element
  and 4 B/row (the per-token scale); swept likewise.
- ``nvfp4 rows`` (``quantize_nvfp4_rows`` given the per-head global scale: the rows pass alone, at
  its default launch): reads 2 B/element, writes 0.5 + 1/16 + 2 B/element.
- ``fp8 V transposed`` (``quantize_fp8_v_transposed``, perm16): the amax pass reads 2 B/element, the
  codes pass reads 2 and writes 1; swept likewise (keys per program x warps of the codes pass).
- ``fp8 V transposed, amax rows``: the same quantizer, the codes kernel at its default launch, the
  amax pass's keys per program swept (``quant_v.amax_rows_per_program``; 64 is one step of the pass's
  loop per program, the pass as it was before the loop).
- ``nvfp4_blocks`` and ``pair_blocks`` (not run by default): NVFP4 heads and the Q/K pair at the
  launches of NVFP4_BLOCKS_SWEEP and PAIR_BLOCKS_SWEEP (blocks of rows per program, each block's loads
  issued before the previous block is quantized), the default launch first and last; with torch's
  ``x.amax()`` as a reference of the read bandwidth.
- ``amax`` (``--kinds amax``; not run by default): V's amax kernel and the per-head amax kernel
  launched alone (reads 2 B/element; the accumulators zeroed once: atomic maxima of the same values
  leave them unchanged), at each launch of V_AMAX_LAUNCHES (rows per step / rows per program) and
  HEAD_AMAX_LAUNCHES (rows per program).
- ``fp8 rows pair`` (``quantize_fp8_rows_pair``: Q and K per token in one launch, the cute and Triton
  backends' call) at the training shape Q B4 H32 S4096 + K B4 H8 S4096, default launch, beside
  ``fp8 rows Q+K, two launches``: the two ``quantize_fp8_rows`` calls it replaces, timed together
  (and the pair with K's programs first).
- ``rope`` (issue 19's design after ``results/quant_amax_h200``): at the same shape, the pair with
  RoPE applied inside it (``rope.quantize_fp8_rows_pair_rope``, what ``attention(..., rope=...)``
  runs), its launch options swept (positions per program x heads per program), against
  ``RoPE, then the pair`` (``rope.rope_rows`` on Q and K, then ``quantize_fp8_rows_pair``: what a
  training step runs when megatron-core applies RoPE) and ``RoPE alone``. The fewest bytes of the
  first two are the fused quantizer's (Q/K read once, codes and scales written once; the FP32
  cos/sin tables, 1 MiB at S 4096, left out), so their ``of copy`` compare the same work; RoPE
  alone reads and writes 2 B/element. Then NVFP4 heads of Q with RoPE in both passes
  (``rope.quantize_nvfp4_heads_rope``, heads per program swept) against RoPE, then
  ``quantize_nvfp4_heads``, both counted at the NVFP4 heads' fewest bytes. Bytes checked equal to
  the unfused paths'.

The target of the forward issue: the quantizers at >= 70% of the copy's bandwidth. Two times per row:
``ms``, the median of ``triton.testing.do_bench`` (CUDA events around the call, L2 flushed between
runs), which includes the gaps between a quantizer's launches whenever the host falls behind the
GPU; and ``kernel ms``, the sum of the call's kernel durations under ``torch.profiler`` (L2 flushed
before each call), the GPU's own time. Run from a tree's root, it times that tree's quantizers.
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

sys.path.insert(0, os.getcwd())  # the fp4_attention of the tree it runs in (bench/variants.sh)

D = 128
SHAPES = {"Q B4 H32 S4096": (4, 32, 4096), "K B4 H8 S4096": (4, 8, 4096), "Q B1 H32 S4096": (1, 32, 4096)}
FP8_SWEEP = [(rows, warps) for rows in (8, 16, 32, 64) for warps in (4, 8)]  # default (16, 4)
NVFP4_SWEEP = [(rows, warps) for rows in (4, 8, 16, 32) for warps in (4, 8)] + [(64, 8)]  # default (16, 4)
V_SWEEP = [(16, 4), (32, 4), (64, 4), (64, 8), (128, 8)]  # keys per program x warps; default (64, 4)
# V's amax pass, keys per program, the codes kernel at its default; 64 is one step per program (the pass
# before the loop); the default comes from the grid's size
AMAX_SWEEP = (64, 128, 256, 512, 1024, 2048)
# the amax kernels launched alone ("amax"): (rows per step, rows per program, warps) of V's looped pass,
# (rows per program, warps) of the per-head pass (one step per program)
V_AMAX_LAUNCHES = [(64, 1024, 4), (32, 1024, 4), (64, 1024, 8), (64, 512, 4), (32, 512, 4), (128, 1024, 8)]
HEAD_AMAX_LAUNCHES = [(64, 4), (32, 4), (64, 8), (128, 4), (128, 8), (256, 8)]
# NVFP4 heads' rows kernel (rows per block, warps, blocks per program), "nvfp4_blocks": each program
# quantizes its blocks one after the other, the next block's loads issued first; the default launch
# (16, 4, 2) first and last, one block per program (the launch before 2026-12-05) beside it
NVFP4_BLOCKS_SWEEP = [(16, 4, 2), (16, 4, 1), (8, 4, 2), (16, 4, 4), (8, 4, 4), (16, 4, 2)]


def _ms(fn) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))


def _kernel_ms(fn, reps: int = 30) -> tuple[float, dict]:
    """GPU time of ``fn``'s kernels per call: the sum of their durations under ``torch.profiler``
    (CUPTI), L2 flushed before each call by a ``bitwise_not`` over 256 MiB that is not counted; the
    host and the gaps between launches left out. Also the time per kernel name (ms per call)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.bitwise_not_()
            fn()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and "bitwise_not" not in e.name:
            per[e.name] += e.device_time / 1e3 / reps
    return sum(per.values()), {k: round(v, 4) for k, v in per.items()}


def copy_bandwidth(n_bytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy of ``n_bytes`` (read + write counted)."""
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = _ms(lambda: dst.copy_(src))
    return 2 * n_bytes / (ms * 1e-3)


def fp8_rows_bytes(n: int, d: int) -> int:
    return n * 2 + n * 1 + (n // d) * 4


def nvfp4_heads_bytes(n: int, d: int) -> int:
    return n * 2 + n * 2 + n // 2 + n // 16 + n * 2 + (n // d) * 4


def nvfp4_rows_bytes(n: int) -> int:
    return n * 2 + n // 2 + n // 16 + n * 2


def v_bytes(n: int) -> int:
    return n * 2 + n * 2 + n * 1


KINDS = ("fp8_rows", "nvfp4", "v", "pair", "rope", "amax", "nvfp4_blocks", "pair_blocks")
# the Q/K pair at the training shape (rows per block, warps, blocks per program), "pair_blocks"; the
# default launch (16, 4, 2) first and last
PAIR_BLOCKS_SWEEP = [(16, 4, 2), (16, 4, 1), (8, 4, 2), (8, 4, 4), (16, 4, 4), (32, 8, 2), (16, 4, 2)]
ROPE_SWEEP = [
    (16, 4),
    (16, 1),
    (16, 2),
    (16, 8),
    (8, 4),
    (32, 4),
    (32, 2),
]  # positions x heads; rope.py's default (16, 2) since 2026-12-05 (PAIR_HEADS), (16, 4) before


def run(shapes=SHAPES, kinds=KINDS) -> tuple[dict, list[dict]]:
    """The records of each shape in ``shapes`` (label -> (B, H, S), in its order) for the quantizer
    ``kinds`` (``fp8_rows``: the per-token sweep; ``nvfp4``: the NVFP4 sweep and rows pass; ``v``: V's
    sweep; ``pair``: the Q/K pair at the training shape, once). The quantizers are those of the
    ``fp4_attention`` in the current directory (so that one copy of this script times the trees of
    ``bench/variants.sh``); a tree without the ``amax_rows`` option has no amax-sweep rows."""
    import inspect

    from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows, quantize_fp8_rows_pair
    from fp4_attention.backends.triton.quant_nvfp4 import quantize_nvfp4_heads, quantize_nvfp4_rows
    from fp4_attention.backends.triton.quant_v import quantize_fp8_v_transposed

    amax_sweep = {"v": "amax_rows" in inspect.signature(quantize_fp8_v_transposed).parameters}
    bw = copy_bandwidth()
    records = []
    for label, (b, h, s) in shapes.items():
        x = torch.randn(b, h, s, D, device="cuda").bfloat16()
        n = x.numel()
        first = len(records)
        if "fp8_rows" in kinds:
            ref = quantize_fp8_rows(x)
            for rows, warps in FP8_SWEEP:
                got = quantize_fp8_rows(x, rows=rows, num_warps=warps)
                same = torch.equal(got.data.view(torch.uint8), ref.data.view(torch.uint8)) and torch.equal(
                    got.scale.nan_to_num(), ref.scale.nan_to_num()
                )
                fn = lambda rows=rows, warps=warps: quantize_fp8_rows(x, rows=rows, num_warps=warps)  # noqa: E731
                records.append(_rec("fp8 rows", label, rows, warps, fn, fp8_rows_bytes(n, D), bw, same))
        if "nvfp4" in kinds:
            ref_nv = quantize_nvfp4_heads(x)

            def nv_same(got):
                return torch.equal(got[0].payload, ref_nv[0].payload) and torch.equal(
                    got[0].block_scale, ref_nv[0].block_scale
                )

            for rows, warps in NVFP4_SWEEP:
                got = quantize_nvfp4_heads(x, rows=rows, num_warps=warps)
                fn = lambda rows=rows, warps=warps: quantize_nvfp4_heads(x, rows=rows, num_warps=warps)  # noqa: E731
                records.append(
                    _rec("nvfp4 heads", label, rows, warps, fn, nvfp4_heads_bytes(n, D), bw, nv_same(got))
                )
            g = ref_nv[0].global_scale
            same = torch.equal(quantize_nvfp4_rows(x, g)[0].payload, ref_nv[0].payload)
            fn = lambda: quantize_nvfp4_rows(x, g)  # noqa: E731
            records.append(_rec("nvfp4 rows", label, None, 4, fn, nvfp4_rows_bytes(n), bw, same))
        if "nvfp4_blocks" in kinds:
            records += _nvfp4_blocks_records(x, label, bw)
        if "v" in kinds:
            ref_v = quantize_fp8_v_transposed(x, perm16=True)

            def v_same(got):
                return torch.equal(got.data.view(torch.uint8), ref_v.data.view(torch.uint8)) and torch.equal(
                    got.scale.nan_to_num(), ref_v.scale.nan_to_num()
                )

            for rows, warps in V_SWEEP:
                got = quantize_fp8_v_transposed(x, perm16=True, rows=rows, num_warps=warps)
                fn = lambda rows=rows, warps=warps: quantize_fp8_v_transposed(  # noqa: E731
                    x, perm16=True, rows=rows, num_warps=warps
                )
                records.append(_rec("fp8 V transposed", label, rows, warps, fn, v_bytes(n), bw, v_same(got)))
            for amax_rows in AMAX_SWEEP if amax_sweep["v"] else ():
                got = quantize_fp8_v_transposed(x, perm16=True, amax_rows=amax_rows)
                fn = lambda amax_rows=amax_rows: quantize_fp8_v_transposed(  # noqa: E731
                    x, perm16=True, amax_rows=amax_rows
                )
                records.append(
                    _rec("fp8 V transposed, amax rows", label, amax_rows, 4, fn, v_bytes(n), bw, v_same(got))
                )
        if "amax" in kinds:
            records += _amax_records(x, label, bw)
        for r in records[first:]:
            print(json.dumps(r), flush=True)
    if "pair" not in kinds and "rope" not in kinds and "pair_blocks" not in kinds:
        return {"copy_TB_per_s": bw / 1e12}, records
    q = torch.randn(4, 32, 4096, D, device="cuda").bfloat16()
    k = torch.randn(4, 8, 4096, D, device="cuda").bfloat16()
    if "rope" in kinds:
        records += _rope_records(q, k, bw)
    if "pair_blocks" in kinds:
        records += _pair_blocks_records(q, k, bw)
    if "pair" not in kinds:
        return {"copy_TB_per_s": bw / 1e12}, records
    pair, one = quantize_fp8_rows_pair(q, k), (quantize_fp8_rows(q), quantize_fp8_rows(k))
    same = all(
        torch.equal(a.data.view(torch.uint8), c.data.view(torch.uint8)) and torch.equal(a.scale, c.scale)
        for a, c in zip(pair, one)
    )
    n = q.numel() + k.numel()
    for kind, fn in (
        ("fp8 rows pair", lambda: quantize_fp8_rows_pair(q, k)),
        ("fp8 rows pair, K's programs first", lambda: quantize_fp8_rows_pair(k, q)),
        ("fp8 rows Q+K, two launches", lambda: (quantize_fp8_rows(q), quantize_fp8_rows(k))),
    ):
        records.append(_rec(kind, "Q B4 H32 + K B4 H8 S4096", None, 4, fn, fp8_rows_bytes(n, D), bw, same))
        print(json.dumps(records[-1]), flush=True)
    return {"copy_TB_per_s": bw / 1e12}, records


def _pair_blocks_records(q, k, bw) -> list[dict]:
    """The Q/K pair (``quantize_fp8_rows_pair``) at each launch of PAIR_BLOCKS_SWEEP, the bytes checked
    equal to the default launch's."""
    from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows_pair

    def raw(pair):
        return [t for a in pair for t in (a.data.view(torch.uint8), a.scale.nan_to_num())]

    ref, n, out = raw(quantize_fp8_rows_pair(q, k)), q.numel() + k.numel(), []
    for rows, warps, blocks in PAIR_BLOCKS_SWEEP:
        kw = dict(rows=rows, num_warps=warps, blocks=blocks)
        same = all(torch.equal(a, b) for a, b in zip(raw(quantize_fp8_rows_pair(q, k, **kw)), ref))
        fn = lambda kw=kw: quantize_fp8_rows_pair(q, k, **kw)  # noqa: E731
        kind = f"fp8 rows pair, {blocks} block(s) per program"
        out.append(_rec(kind, "Q B4 H32 + K B4 H8 S4096", rows, warps, fn, fp8_rows_bytes(n, D), bw, same))
    return out


def _nvfp4_blocks_records(x, label, bw) -> list[dict]:
    """NVFP4 heads (``quantize_nvfp4_heads``) at each launch of NVFP4_BLOCKS_SWEEP, the bytes checked
    equal to the default launch's; and ``x.amax()`` (torch's reduction, 2 B/element read once) as a
    reference of the read bandwidth the amax pass could reach."""
    from fp4_attention.backends.triton.quant_nvfp4 import quantize_nvfp4_heads

    def raw(got):  # payload, block scales, global scale, decode (bits)
        t, dec, _ = got
        return [t.payload, t.block_scale, t.global_scale.nan_to_num(), dec.view(torch.int16)]

    ref, n, out = raw(quantize_nvfp4_heads(x)), x.numel(), []
    for rows, warps, blocks in NVFP4_BLOCKS_SWEEP:
        kw = dict(rows=rows, num_warps=warps, blocks=blocks)
        same = all(torch.equal(a, b) for a, b in zip(raw(quantize_nvfp4_heads(x, **kw)), ref))
        kind = f"nvfp4 heads, {blocks} block(s) per program"
        fn = lambda kw=kw: quantize_nvfp4_heads(x, **kw)  # noqa: E731
        out.append(_rec(kind, label, rows, warps, fn, nvfp4_heads_bytes(n, D), bw, same))
    out.append(_rec("torch x.amax() (read reference)", label, None, None, x.amax, n * 2, bw, True))
    return out


def _amax_records(x, label, bw) -> list[dict]:
    """The amax kernels alone on ``x [B, H, S, D]`` (read once: 2 B/element) at each launch of
    V_AMAX_LAUNCHES (V's per-channel pass, a tree with its looped kernel) and HEAD_AMAX_LAUNCHES
    (the per-head pass of NVFP4's Q/K and of dO), the amax and flags checked equal to the first
    launch's."""
    import inspect

    import triton

    from fp4_attention.backends.triton import quant_common, quant_v

    b, h, s, d = x.shape
    out, first = [], {}

    def launch(kind, rows, warps, kernel, programs, acc_shape, extra, consts):
        amax, bad = quant_common.zeroed_amax_and_flag(acc_shape, x.device)
        args = (x, amax, bad, h, s, *x.stride()[:3], *extra)

        def fn():
            # atomic maxima of the same values: a repeated call leaves the accumulators as they were
            kernel[(programs, b * h)](*args, **consts, num_warps=warps)

        fn()
        ref = first.setdefault(kind, (amax.clone(), bad.clone()))
        same = torch.equal(amax, ref[0]) and torch.equal(bad, ref[1])
        out.append(_rec(kind, label, rows, warps, fn, x.numel() * 2, bw, same))

    if "ROWS" in inspect.signature(quant_v._v_amax_kernel.fn).parameters:
        for step, rows, warps in V_AMAX_LAUNCHES:
            consts = dict(D=d, BLOCK_S=step, ROWS=rows)
            launch(
                "V amax pass alone",
                f"{step}/{rows}",
                warps,
                quant_v._v_amax_kernel,
                triton.cdiv(s, rows),
                (b * h, d),
                (x.stride(3),),
                consts,
            )
    for rows, warps in HEAD_AMAX_LAUNCHES:
        launch(
            "head amax pass alone",
            rows,
            warps,
            quant_common._head_amax_kernel,
            triton.cdiv(s, rows),
            (b * h,),
            (),
            dict(D=d, BLOCK_S=rows),
        )
    return out


def _rope_records(q, k, bw) -> list[dict]:
    """The ``rope`` rows (module docstring); none for a tree without ``backends/triton/rope.py``."""
    try:
        from fp4_attention import RoPETables
        from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows_pair
        from fp4_attention.backends.triton.quant_nvfp4 import quantize_nvfp4_heads
        from fp4_attention.backends.triton.rope import (
            quantize_fp8_rows_pair_rope,
            quantize_nvfp4_heads_rope,
            rope_rows,
        )
    except ImportError:
        return []
    s, dev = q.shape[2], q.device
    inv = 500000.0 ** (-torch.arange(0, D, 2, dtype=torch.float32, device=dev) / D)
    t = RoPETables.from_angles(torch.arange(s, dtype=torch.float32, device=dev)[:, None] * inv)
    tq, tk = (t.cos_q, t.sin_q), (t.cos_k, t.sin_k)

    def unfused():
        return quantize_fp8_rows_pair(rope_rows(q, *tq), rope_rows(k, *tk))

    ref = unfused()

    def same(got) -> bool:
        return all(
            torch.equal(a.data.view(torch.uint8), c.data.view(torch.uint8))
            and torch.equal(a.scale.nan_to_num(), c.scale.nan_to_num())
            for a, c in zip(got, ref)
        )

    shape, n = "Q B4 H32 + K B4 H8 S4096", q.numel() + k.numel()
    out = []
    for rows, heads in ROPE_SWEEP:
        fn = lambda rows=rows, heads=heads: quantize_fp8_rows_pair_rope(q, k, tq, tk, rows=rows, heads=heads)  # noqa: E731
        out.append(
            _rec(
                f"fp8 rows pair + RoPE fused, {heads} heads/program",
                shape,
                rows,
                4,
                fn,
                fp8_rows_bytes(n, D),
                bw,
                same(fn()),
            )
        )
    out.append(_rec("RoPE, then the pair", shape, None, 4, unfused, fp8_rows_bytes(n, D), bw, True))
    # NVFP4 (nvfp4qk_fp8pv's Q): RoPE in both passes against RoPE, then the two passes
    nq = q.numel()
    ref_nv = quantize_nvfp4_heads(rope_rows(q, *tq))
    for heads in (4, 1, 2):
        got = quantize_nvfp4_heads_rope(q, *tq, heads=heads)
        same_nv = all(
            torch.equal(a.nan_to_num(), b.nan_to_num())
            for a, b in (
                (got[0].payload, ref_nv[0].payload),
                (got[0].block_scale, ref_nv[0].block_scale),
                (got[0].global_scale, ref_nv[0].global_scale),
                (got[1], ref_nv[1]),
                (got[2], ref_nv[2]),
            )
        )
        fn = lambda heads=heads: quantize_nvfp4_heads_rope(q, *tq, heads=heads)  # noqa: E731
        out.append(
            _rec(
                f"nvfp4 heads + RoPE fused, {heads} heads/program",
                "Q B4 H32 S4096",
                None,
                4,
                fn,
                nvfp4_heads_bytes(nq, D),
                bw,
                same_nv,
            )
        )
    out.append(
        _rec(
            "RoPE, then nvfp4 heads",
            "Q B4 H32 S4096",
            None,
            4,
            lambda: quantize_nvfp4_heads(rope_rows(q, *tq)),
            nvfp4_heads_bytes(nq, D),
            bw,
            True,
        )
    )
    out.append(
        _rec(
            "RoPE alone (Q and K)",
            shape,
            None,
            4,
            lambda: (rope_rows(q, *tq), rope_rows(k, *tk)),
            4 * n,
            bw,
            True,
        )
    )
    for r in out:
        print(json.dumps(r), flush=True)
    return out


def _rec(kind, shape, rows, warps, fn, n_bytes, bw, same) -> dict:
    """One row: ``fn`` timed by CUDA events (``ms``: launch gaps included) and by the sum of its
    kernels' durations (``kernel_ms``), each with its bandwidth over the fewest bytes."""
    ms = _ms(fn)
    kernel_ms, kernels = _kernel_ms(fn)
    tbs = n_bytes / (ms * 1e-3) / 1e12
    ktbs = n_bytes / (kernel_ms * 1e-3) / 1e12
    return {
        "quantizer": kind,
        "shape": shape,
        "rows": rows,
        "warps": warps,
        "ms": round(ms, 4),
        "min_bytes": n_bytes,
        "TB_per_s": round(tbs, 3),
        "of_copy": round(tbs * 1e12 / bw, 3),
        "kernel_ms": round(kernel_ms, 4),
        "kernel_of_copy": round(ktbs * 1e12 / bw, 3),
        "kernels": kernels,
        "bytes_equal_default": bool(same),
    }


def to_markdown(meta: dict, records: list[dict]) -> str:
    lines = [
        f"# Quantizer bandwidth, {meta['gpu']}",
        "",
        f"- date {meta['date']}, commit {meta['commit']}, torch {meta['torch']}, triton {meta['triton']}",
        f"- same-run device-to-device copy of 1 GiB: {meta['copy_TB_per_s']:.3f} TB/s (read + write); "
        "`of copy` = the quantizer's fewest bytes per second over it (target >= 0.70); `ms` by CUDA events "
        "(launch gaps included), `kernel ms` the sum of its kernels' durations (torch.profiler)",
        "- `rows`: rows per program, or per block for the row quantizers (fp8 rows, the pair, NVFP4 heads), "
        "whose programs take 2 blocks each unless the row says otherwise (their default since 8b8d371; "
        "one block before)",
        "",
        "| quantizer | shape | rows | warps | ms | TB/s | of copy | kernel ms | of copy (kernels) "
        "| bytes = default |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        rows = r["rows"] if r["rows"] is not None else "-"
        same = "yes" if r["bytes_equal_default"] else "NO"
        lines.append(
            f"| {r['quantizer']} | {r['shape']} | {rows} | {r['warps']} "
            f"| {r['ms']:.4f} | {r['TB_per_s']:.3f} | {r['of_copy']:.2f} | {r['kernel_ms']:.4f} "
            f"| {r['kernel_of_copy']:.2f} | {same} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    p.add_argument(
        "--shapes",
        nargs="+",
        choices=list(SHAPES),
        default=list(SHAPES),
        help="the shapes to sweep, in this order (a name may repeat: each is timed again)",
    )
    p.add_argument(
        "--kinds",
        nargs="+",
        choices=KINDS,
        default=[k for k in KINDS if k not in ("amax", "nvfp4_blocks", "pair_blocks")],
        help="the quantizers to time",
    )
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("quant_bench: needs a CUDA GPU (the Triton quantizers)", file=sys.stderr)
        return 2
    import triton

    commit = (
        os.environ.get("BENCH_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    # a repeated shape gets its own label, so its rows stay apart
    shapes = {
        f"{name} #{i}" if a.shapes.count(name) > 1 else name: SHAPES[name] for i, name in enumerate(a.shapes)
    }
    extra, records = run(shapes, a.kinds)
    meta = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(),
        "commit": commit or "unknown",
        "torch": torch.__version__,
        "triton": triton.__version__,
        **extra,
    }
    md = to_markdown(meta, records)
    print(md)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out + ".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
        Path(a.out + ".md").write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
