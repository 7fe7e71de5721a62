"""Activation bytes the attention saves for backward, per training recipe.

    python bench/saved_bytes.py [--seqlen 4096] [--backend reference]

Counts every tensor autograd keeps (saved_tensors_hooks) for one attention call at the
Llama-3.1-8B layer shape (B=1, Hq=32, Hkv=8, D=128), and reports the total beyond the output O,
which the output projection keeps anyway. Byte counts do not depend on the backend's numerics:
the Triton backend saves the same payloads and scales (V8 transposed) as the reference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fp4_attention as fa  # noqa: E402


def saved_bytes(recipe: str, *, b=1, hq=32, hkv=8, s=4096, d=128, backend="reference", device="cpu") -> dict:
    """Bytes saved for backward by one attention call: total, the output's share, and the rest."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, hq, s, d, generator=g).bfloat16().to(device).requires_grad_()
    k = torch.randn(b, hkv, s, d, generator=g).bfloat16().to(device).requires_grad_()
    v = torch.randn(b, hkv, s, d, generator=g).bfloat16().to(device).requires_grad_()
    saved: dict[int, torch.Tensor] = {}

    def pack(t):
        saved[id(t)] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fa.attention(q, k, v, recipe=recipe, causal=True, layout="bhsd", backend=backend)
    total = sum(t.numel() * t.element_size() for t in saved.values())
    out_bytes = out.numel() * out.element_size()
    return {"recipe": recipe, "total": total, "output": out_bytes, "beyond_output": total - out_bytes}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--backend", default="reference")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.backend != "reference":
        __import__(f"fp4_attention.{args.backend}_backend")
    rows = [
        saved_bytes(r, s=args.seqlen, backend=args.backend, device=args.device) for r in fa.TRAINING_RECIPES
    ]
    base = rows[0]["beyond_output"]
    print(f"saved for backward, B1 Hq32 Hkv8 S{args.seqlen} D128 ({args.backend}):")
    print("| recipe | saved beyond O (MiB) | vs bf16 |\n|---|---|---|")
    for r in rows:
        print(f"| {r['recipe']} | {r['beyond_output'] / 2**20:.2f} | {r['beyond_output'] / base:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
