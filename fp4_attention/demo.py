"""A short demonstration of every recipe on one attention shape (``python -m fp4_attention.demo``).

Prints, per recipe, the output's cosine and relative L2 against float64 attention on the same BF16
inputs, the gradient cosines for the training recipes, and the wall time of the chosen backend.
"""

from __future__ import annotations

import argparse
import time

import torch

from . import RECIPES, attention, get_recipe
from .exact import naive_attention


def _cos_rel(x: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    a, b = x.detach().double().cpu().flatten(), ref.detach().double().cpu().flatten()
    return float(a @ b / (a.norm() * b.norm())), float((a - b).norm() / b.norm())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--backend", default="reference")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    if args.backend != "reference":
        __import__(f"fp4_attention.{args.backend}_backend")
    g = torch.Generator().manual_seed(0)
    shape_q = (1, args.heads, args.seqlen, args.headdim)
    shape_kv = (1, args.kv_heads, args.seqlen, args.headdim)
    q, k, v = (torch.randn(s, generator=g).bfloat16() for s in (shape_q, shape_kv, shape_kv))
    dout = torch.randn(shape_q, generator=g).bfloat16()
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    ref, _ = naive_attention(qd, kd, vd, causal=True, softmax_scale=args.headdim ** -0.5)
    ref.backward(dout.double())
    print(f"fp4_attention demo: causal B=1 Hq={args.heads} Hkv={args.kv_heads} S={args.seqlen} D={args.headdim}, "
          f"backend={args.backend}, device={args.device}; metrics vs float64 on the same BF16 inputs")
    print(f"{'recipe':28s} {'out cos':>9s} {'out relL2':>10s} {'dQ cos':>8s} {'dK cos':>8s} {'dV cos':>8s} {'ms':>8s}")
    for name in RECIPES:
        rec = get_recipe(name)
        qq, kk, vv = (t.clone().to(args.device).requires_grad_(rec.trainable) for t in (q, k, v))
        t0 = time.perf_counter()
        with torch.enable_grad() if rec.trainable else torch.no_grad():
            out = attention(qq, kk, vv, recipe=rec, causal=True, layout="bhsd", backend=args.backend)
            if rec.trainable:
                out.backward(dout.to(args.device))
        ms = (time.perf_counter() - t0) * 1e3
        cos, rel = _cos_rel(out, ref)
        grads = [f"{_cos_rel(gm, gr)[0]:8.5f}" for gm, gr in ((qq.grad, qd.grad), (kk.grad, kd.grad), (vv.grad, vd.grad))
                 ] if rec.trainable else [f"{'-':>8s}"] * 3
        print(f"{name:28s} {cos:9.5f} {rel:10.4f} {' '.join(grads)} {ms:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
