"""Warm launches of a CuTe attention forward, for Nsight Compute (where the time goes).

    ncu --clock-control none -k regex:FP8ForwardSm90 --launch-skip 2 --launch-count 1 --set full \\
        -o prof python bench/cute_profile.py --variant fp8

Quantizes Q/K/V once with the Triton quantizers (no attention kernel runs for that), then launches
the chosen forward exactly three times; the first call also compiles, so ``--launch-skip 2``
profiles the third, warm launch. ``--variant``: ``fp8`` (the contract's kernel: QK promoted per
32, PV per tile, ping-pong), ``fp8_early`` (the same numerics with the ``early_k_scales`` and
``qk_pair_issue`` schedule options), ``fp8_overlap_unpromoted`` (intra-warpgroup overlap, no
promotion: outside the contract, for comparison), ``fa4_bf16`` (FA4's BF16 forward, whose kernel
name matches ``FlashAttentionForwardSm90``; ``--tiles`` does not apply to it).
``--shape B,Hq,Hkv,S`` with D = 128; needs a CUDA GPU (sm_90) and the ``cute`` extra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

D = 128
VARIANTS = {
    "fp8": {},
    "fp8_early": {"early_k_scales": True, "qk_pair_issue": True},
    "fp8_overlap_unpromoted": {"intra_wg_overlap": True, "promote_qk": False, "promote_pv": False},
    "fa4_bf16": None,
}
LAUNCHES = 3


def _ints(text: str, n: int, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) != n or min(vals) <= 0:
        raise SystemExit(
            f"cute_profile: {what} must be {n} positive integers separated by commas, got {text!r}"
        )
    return vals


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=sorted(VARIANTS), default="fp8")
    p.add_argument("--shape", default="2,32,32,8192", help="B,Hq,Hkv,S (D = 128)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--tiles", default="128,128,2", help="tile_m,tile_n,stages of the fp8 variants")
    args = p.parse_args(argv)
    b, hq, hkv, s = _ints(args.shape, 4, "--shape B,Hq,Hkv,S")
    tiles = _ints(args.tiles, 3, "--tiles tile_m,tile_n,stages")
    if not torch.cuda.is_available():
        raise SystemExit("cute_profile: needs a CUDA GPU (sm_90); this machine has none")
    torch.manual_seed(0)
    q = torch.randn(b, hq, s, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16)
    import fp4_attention as fa

    if args.variant == "fa4_bf16":
        from fp4_attention.backends.fa4.backend import FA4Backend

        def run():
            FA4Backend().forward(q, k, v, fa.get_recipe("bf16"), causal=args.causal, softmax_scale=D**-0.5)
    else:
        from fp4_attention.backends.cute import backend as cute_backend

        ops = cute_backend.kernel_operands(*cute_backend.quantize_inputs(q, k, v), D**-0.5)

        def run():
            cute_backend.forward_fp8(*ops, causal=args.causal, tiles=tiles, **VARIANTS[args.variant])

    for _ in range(LAUNCHES):
        run()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
