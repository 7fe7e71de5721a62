"""One forward + backward step of ``fa.attention`` for ``compute-sanitizer --tool memcheck``: finds
reads and writes outside their allocations in the step's kernels (quantizers, attention kernels,
backward preparation and conversion).

Run it with PyTorch's caching allocator off, so that every tensor is its own allocation and an
access past a tensor's end lands outside any allocation, where memcheck sees it::

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --print-limit 20 \\
        python3 bench/memcheck_step.py --backend cute --recipe fp8 --shape 1,32,8,4096

The step is the benchmark's (``attention_bench.ours_fn``'s): BF16 N(0, 1) ``q [B, Hq, S, D]``,
``k, v [B, Hkv, S, D]``, causal by default, layout ``bhsd``, ``.backward`` of a random dO. It prints
one line at the end; memcheck's summary ("ERROR SUMMARY: N errors") follows it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's fp4_attention, as a script

import fp4_attention as fa  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cute", help="a GPU backend: cute, triton, fa4")
    p.add_argument("--recipe", default="fp8")
    p.add_argument("--shape", default="1,32,8,4096", help="B,Hq,Hkv,S (D = --head-dim)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--non-causal", action="store_true")
    p.add_argument("--steps", type=int, default=1)
    args = p.parse_args()
    b, hq, hkv, s = (int(x) for x in args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).bfloat16()

    q, k, v = randn(b, hq, s, args.head_dim), randn(b, hkv, s, args.head_dim), randn(b, hkv, s, args.head_dim)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    dout = randn(b, hq, s, args.head_dim)
    for _ in range(args.steps):
        out = fa.attention(
            q, k, v, recipe=args.recipe, causal=not args.non_causal, layout="bhsd", backend=args.backend
        )
        out.backward(dout)
    torch.cuda.synchronize()
    finite = all(bool(torch.isfinite(t).all()) for t in (out, q.grad, k.grad, v.grad))
    print(
        f"memcheck_step: {args.backend} {args.recipe} {args.shape} D{args.head_dim} steps={args.steps} "
        f"done, outputs finite: {finite}"
    )


if __name__ == "__main__":
    main()
