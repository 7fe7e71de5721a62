"""One forward launch of a CuTe attention kernel, for Nsight Compute (issue 11: where the time goes).

    ncu --clock-control none -k regex:FP8ForwardSm90 --launch-skip 2 --launch-count 1 --set full \\
        -o prof python bench/cute_profile.py --variant fp8

Runs the kernel three times on operands quantized once (the first call compiles), so
``--launch-skip 2`` profiles a warm launch. ``--variant``: ``fp8`` (the contract's kernel: QK
promoted per 32, PV per tile, ping-pong), ``fp8_overlap_unpromoted`` (intra-warpgroup overlap, no
promotion: outside the contract, for comparison), ``fa4_bf16`` (FA4's BF16 forward; its kernel
name matches ``FlashAttentionForwardSm90``). Shape: ``--shape B,Hq,Hkv,S`` with D = 128.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

D = 128
VARIANTS = {"fp8": {}, "fp8_overlap_unpromoted": {"intra_wg_overlap": True, "promote_pv": False}, "fa4_bf16": None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=sorted(VARIANTS), default="fp8")
    p.add_argument("--shape", default="2,32,32,8192", help="B,Hq,Hkv,S (D = 128)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--tiles", default="128,128,2", help="tile_m,tile_n,stages of the fp8 variants")
    args = p.parse_args(argv)
    b, hq, hkv, s = (int(x) for x in args.shape.split(","))
    torch.manual_seed(0)
    q = torch.randn(b, hq, s, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16)
    import fp4_attention as fa

    if args.variant == "fa4_bf16":
        from fp4_attention.fa4_backend import FA4Backend

        def run():
            FA4Backend().forward(q, k, v, fa.get_recipe("bf16"), causal=args.causal, softmax_scale=D ** -0.5)
    else:
        from fp4_attention import cute_backend

        tiles = tuple(int(x) for x in args.tiles.split(","))
        _, _, st = cute_backend.CuteBackend().forward(q, k, v, fa.get_recipe("fp8"), causal=args.causal,
                                                      softmax_scale=D ** -0.5, tiles=tiles)
        ops = cute_backend.kernel_operands(st.q, st.k, st.v, D ** -0.5)

        def run():
            cute_backend.forward_fp8(*ops, causal=args.causal, tiles=tiles, **VARIANTS[args.variant])
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
