"""The CuTe fp8 backward's operand preparation, timed without the CuTe DSL (Triton and torch only).

    cd <a checkout's root> && python3 <path to>/bwd_prep_bench.py --out <prefix>   # .json and .md

It imports ``fp4_attention`` from the current directory, so that one copy of this script times the
trees that ``bench/variants.sh`` lays side by side (their own code, in one run). Rows, per shape:
- ``dout``: ``quantize_dout_fused`` as ``cute.backend.backward_operands`` calls it (dO in E5M2 in
  both layouts, D, the per-query vectors; with the BF16 image of the Q payload where the tree's
  kernel writes it, else followed by torch's ``q8.to(torch.bfloat16)``, as such a tree does);
- ``kv``: the BF16 image of the K payload and V in key order: ``triton.bwd_kv`` where the tree has
  it, else torch's cast, gather and transposing copy;
- ``total``: both, one after the other.
``--dout-launches 32x8 16x4 ...`` adds, at the first shape, the ``dout`` row for each launch of the
quantizing kernel (queries per program x warps; ``dout_quant.QUANT_BLOCK``, ``QUANT_WARPS``), each
checked to give the default launch's bytes.
``--ablate`` adds, at each shape, the ``dout`` pass with parts left out, to show where its time goes:
without the Q image (``q8=None``), without it and dO^T (``transposed=False``: no transposed store,
no ``r``/``row``; the Q image needs the Q scales of ``transposed``), the amax pass alone, and a
device copy of dO (BF16, read + write) as the same run's bandwidth yardstick.
Medians of ``triton.testing.do_bench`` (CUDA events), GB/s = bytes read and written / time.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import inspect
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.getcwd())

from fp4_attention.backends.triton import (
    dout_quant,  # noqa: E402
    quant_common,  # noqa: E402
)
from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows  # noqa: E402
from fp4_attention.backends.triton.quant_v import quantize_fp8_v_transposed  # noqa: E402

SHAPES = [(4, 32, 8, 4096), (2, 32, 32, 8192)]  # (B, Hq, Hkv, S), D 128
D = 128


def _operands(b, hq, hkv, s):
    g = torch.Generator(device="cuda").manual_seed(0)
    heads = (hq, hkv, hkv, hq, hq)
    q, k, v, do, o = (torch.randn(b, h, s, D, device="cuda", generator=g).bfloat16() for h in heads)
    q_s, k_s = quantize_fp8_rows(q), quantize_fp8_rows(k)
    v_s = quantize_fp8_v_transposed(v, perm16=True)
    lse = torch.randn(b, hq, s, device="cuda")
    return q_s, k_s, v_s, do, o, lse


def _dout_fn(q_s, v_s, do, o, lse):
    fused_q = "q8" in inspect.signature(dout_quant.quantize_dout_fused).parameters
    v_scale = v_s.scale.squeeze(2).contiguous()
    q_scale = q_s.scale.squeeze(-1)
    kw = dict(lift=8, pad_to=64, transposed=True, q_scale=q_scale, qk_scale_log2=0.1)

    def run():
        if fused_q:
            return dout_quant.quantize_dout_fused(do, o, v_scale, lse, q8=q_s.data, **kw)
        out = dout_quant.quantize_dout_fused(do, o, v_scale, lse, **kw)
        return out, q_s.data.to(torch.bfloat16)

    return run, "fused" if fused_q else "kernel + torch cast"


def _kv_fn(k_s, v_s, s):
    try:
        from fp4_attention.backends.triton.bwd_kv import backward_kv_operands
    except ImportError:
        from fp4_attention.backends.pv_layout import unpermute_v_keys

        def torch_kv():
            kb = k_s.data.to(torch.bfloat16)
            return kb, unpermute_v_keys(v_s.data, s).transpose(-1, -2).contiguous()

        return torch_kv, "torch"
    if "col2_scale" in inspect.signature(backward_kv_operands).parameters:  # col/col2 in the kernel
        return (lambda: backward_kv_operands(k_s, v_s.data, col2_scale=2.0**-8)), "triton.bwd_kv"

    def older_tree():  # an older tree (bench/variants.sh): the kernel, then torch's col2
        return backward_kv_operands(k_s.data, v_s.data), (k_s.scale * 2.0**-8).squeeze(-1)

    return older_tree, "triton.bwd_kv + torch col2"


def _set_launch(launch: str) -> None:
    """``BLOCKxWARPS``: the quantizing kernel's queries per program x warps."""
    dout_quant.QUANT_BLOCK, dout_quant.QUANT_WARPS = (int(x) for x in launch.split("x"))


def _check_same(ref, got, launch: str) -> None:
    """A launch option must not change a byte of the codes or the BF16 image, nor D beyond FP32
    summation order; raises ``AssertionError`` naming the launch otherwise."""
    if isinstance(ref, tuple):  # an older tree: (operands, torch's Q image)
        ref, got = ref[0], got[0]
    for name in ("dot", "qb"):
        if hasattr(ref, name):
            assert torch.equal(getattr(ref, name).view(torch.uint8), getattr(got, name).view(torch.uint8)), (
                f"launch {launch}: {name} differs from the default launch's"
            )
    same_do = torch.equal(ref.do_q.data.view(torch.uint8), got.do_q.data.view(torch.uint8))
    assert same_do, f"launch {launch}: dO's codes differ from the default launch's"
    # D sums D products per row: another order moves it by a few FP32 ulps of its largest terms
    atol = 1e-5 * float(ref.delta.abs().max())
    torch.testing.assert_close(got.delta, ref.delta, rtol=1e-5, atol=atol, msg=f"launch {launch}: D")


def _ablation(q_s, v_s, do, o, lse, shape) -> list[dict]:
    """The ``--ablate`` rows at one shape (module docstring); GB/s over each row's own bytes."""
    v_scale = v_s.scale.squeeze(2).contiguous()
    q_scale = q_s.scale.squeeze(-1)
    kw = dict(lift=8, pad_to=64, qk_scale_log2=0.1)
    n = do.numel()
    b, hq, sq, _ = do.shape
    amax, bad = torch.zeros(b * hq, device="cuda"), torch.zeros(b * hq, dtype=torch.int32, device="cuda")
    grid = (triton.cdiv(sq, 64), b * hq)
    sink = torch.empty_like(do)

    def amax_only():
        g = hq // v_scale.shape[1]
        quant_common._head_amax_kernel[grid](
            do, amax, bad, hq, sq, *do.stride()[:3], D=D, BLOCK_S=64, VS=v_scale, G=g, CHANNEL_SCALED=True
        )

    def dout(**extra):
        return lambda: dout_quant.quantize_dout_fused(do, o, v_scale, lse, **kw, **extra)

    rows = (
        # (row, fn, bytes), counted as the "dout" row's (the amax pass's second read of dO left out):
        # dO and O in, dO's codes out; dO^T's codes out; Q's codes in and their BF16 image out
        ("dout w/o Q image", dout(transposed=True, q_scale=q_scale), n * 6),
        ("dout w/o both", dout(), n * 5),
        ("amax pass", amax_only, n * 2),
        ("dO copy", lambda: sink.copy_(do), n * 4),
    )
    out = []
    for row, fn, nbytes in rows:
        ms = float(triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median"))
        out.append(dict(shape=shape, row=row, how="ablation", ms=ms, gb_s=nbytes / ms / 1e6))
        print(json.dumps(out[-1]), flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    p.add_argument("--dout-launches", nargs="*", default=[], help="BLOCKxWARPS of the dO quantizing kernel")
    p.add_argument("--ablate", action="store_true", help="the dout pass with parts left out (docstring)")
    args = p.parse_args(argv)
    meta = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(),
        "commit": os.environ.get("BENCH_COMMIT", "unknown"),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    records = []
    for b, hq, hkv, s in SHAPES:
        q_s, k_s, v_s, do, o, lse = _operands(b, hq, hkv, s)
        dout_run, dout_how = _dout_fn(q_s, v_s, do, o, lse)
        kv_run, kv_how = _kv_fn(k_s, v_s, s)
        nq, nk = b * hq * s * D, b * hkv * s * D
        # dO, O (BF16) and Q (E4M3) in; dO twice (E5M2) and Q (BF16) out; K and V (E4M3) in, K (BF16)
        # and V (E4M3) out; the per-query vectors are < 1% and not counted
        dout_bytes, kv_bytes = nq * (2 + 2 + 1) + nq * (1 + 1 + 2), nk * 2 + nk * (2 + 1)
        for row, fn, how, nbytes in (
            ("dout", dout_run, dout_how, dout_bytes),
            ("kv", kv_run, kv_how, kv_bytes),
            ("total", lambda: (dout_run(), kv_run()), f"{dout_how}; {kv_how}", dout_bytes + kv_bytes),
        ):
            ms = float(triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median"))
            rec = dict(shape=f"B{b} H{hq}/{hkv} S{s} D{D}", row=row, how=how, ms=ms, gb_s=nbytes / ms / 1e6)
            records.append(rec)
            print(json.dumps(rec), flush=True)
        if args.ablate:
            records += _ablation(q_s, v_s, do, o, lse, f"B{b} H{hq}/{hkv} S{s} D{D}")
        names = ("QUANT_BLOCK", "QUANT_WARPS")
        default = {n: getattr(dout_quant, n) for n in names}
        ref = dout_run()
        for launch in args.dout_launches if (b, hq, hkv, s) == SHAPES[0] else []:
            _set_launch(launch)
            _check_same(ref, dout_run(), launch)
            ms = float(triton.testing.do_bench(dout_run, warmup=50, rep=200, return_mode="median"))
            rec = dict(shape=f"B{b} H{hq}/{hkv} S{s} D{D}", row=f"dout {launch}", how=dout_how, ms=ms)
            records.append({**rec, "gb_s": dout_bytes / ms / 1e6})
            print(json.dumps(records[-1]), flush=True)
            for n, v in default.items():
                setattr(dout_quant, n, v)
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump({"meta": meta, "records": records}, f, indent=1)
        lines = [
            "# The CuTe fp8 backward's operand preparation (bench/bwd_prep_bench.py)",
            "",
            f"- {meta['date']}, {meta['gpu']}, commit {meta['commit']}, torch {meta['torch']}, "
            f"triton {meta['triton']}",
            "",
            "| shape | row | how | ms | GB/s |",
            "|---|---|---|---|---|",
            *[
                f"| {r['shape']} | {r['row']} | {r['how']} | {r['ms']:.3f} | {r['gb_s']:.0f} |"
                for r in records
            ],
        ]
        with open(args.out + ".md", "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
