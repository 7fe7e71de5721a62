"""Warm launches of a CuTe attention forward or backward, for Nsight Compute (where the time goes).

    ncu --clock-control none -k regex:FP8ForwardSm90 --launch-skip 2 --launch-count 1 --set full \\
        -o prof python bench/cute_profile.py --variant fp8

Quantizes Q/K/V once with the Triton quantizers (no attention kernel runs for that), then launches
the chosen forward exactly three times; the first call also compiles, so ``--launch-skip 2``
profiles the third, warm launch. ``--variant``: ``fp8`` (the contract's kernel: PV promoted per
tile, ping-pong), ``fa4_bf16`` (FA4's BF16 forward, whose kernel
name matches ``FlashAttentionForwardSm90``; ``--tiles`` does not apply to it), ``fp8_bwd`` (our
backward kernel ``FP8BackwardSm90`` on one forward's state and prepared operands: profile with
``-k regex:FP8BackwardSm90``), ``fa4_bf16_bwd`` (FA4's BF16 backward, ``FlashAttentionBackwardSm90``).
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
    "fa4_bf16": None,
    "fp8_bwd": None,
    "fa4_bf16_bwd": None,
}
LAUNCHES = 3


def _ints(text: str, n: int, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if len(vals) != n or min(vals) <= 0:
        raise ValueError(f"{what} must be {n} positive integers separated by commas, got {text!r}")
    return vals


def _backward_launch(variant: str, q, k, v, causal: bool):
    """One backward launch on a fixed forward state and dO: our kernel on prepared operands
    (``cute.backend.backward_operands`` once, outside), or FA4's whole BF16 backward."""
    import fp4_attention as fa

    dout = torch.randn_like(q)
    if variant == "fa4_bf16_bwd":
        from fp4_attention.backends.fa4.backend import FA4Backend

        be, rec = FA4Backend(), fa.get_recipe("bf16")
        _, _, st = be.forward(q, k, v, rec, causal=causal, softmax_scale=D**-0.5)
        return lambda: be.backward(st, dout, rec, causal=causal, softmax_scale=D**-0.5)
    from fp4_attention.backends.cute import backend as cute_backend

    rec = fa.get_recipe("fp8")
    _, _, st = cute_backend.CuteBackend().forward(q, k, v, rec, causal=causal, softmax_scale=D**-0.5)
    ops = cute_backend.backward_operands(st, dout, D**-0.5)
    args = cute_backend._bwd_args(ops)
    fn = cute_backend._compiled_bwd(D, q.shape[1] // k.shape[1], causal, False, args, D**-0.5)
    raw = [t.view(torch.uint8) if t.element_size() == 1 else t for t in args]
    return lambda: fn(*raw, D**-0.5)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=sorted(VARIANTS), default="fp8")
    p.add_argument("--shape", default="2,32,32,8192", help="B,Hq,Hkv,S (D = 128)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--tiles", default="128,128,2", help="tile_m,tile_n,stages of the fp8 variants")
    args = p.parse_args(argv)
    try:
        b, hq, hkv, s = _ints(args.shape, 4, "--shape B,Hq,Hkv,S")
        tiles = _ints(args.tiles, 3, "--tiles tile_m,tile_n,stages")
    except ValueError as err:
        p.error(str(err))  # exit 2, one sentence
    if not torch.cuda.is_available():
        print("cute_profile: needs a CUDA GPU (sm_90); this machine has none", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    q = torch.randn(b, hq, s, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16)
    import fp4_attention as fa

    if args.variant in ("fp8_bwd", "fa4_bf16_bwd"):
        run = _backward_launch(args.variant, q, k, v, args.causal)
    elif args.variant == "fa4_bf16":
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
