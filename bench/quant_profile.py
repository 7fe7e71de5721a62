"""One quantizer of the forward, launched three times on one input, for Nsight Compute
(``--launch-skip 2 --launch-count 1`` profiles the third, warm launch):

    ncu -k regex:_fp8_rows_kernel --launch-skip 2 --launch-count 1 --set full -o rows \\
        python3 bench/quant_profile.py --kernel rows
    ncu -k regex:_fp8_v_t_kernel --launch-skip 2 --launch-count 1 --set full -o v \\
        python3 bench/quant_profile.py --kernel v

``--kernel``: ``rows`` (``quantize_fp8_rows``, Q or K per token), ``v`` (``quantize_fp8_v_transposed``
with perm16, the cute backend's V: an amax kernel, then ``_fp8_v_t_kernel``) or ``nvfp4``
(``quantize_nvfp4_heads``). ``--shape B,H,S``: BF16 ``[B, H, S, 128]`` from N(0, 1), default Q's
shape at B4 H32 S4096.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    """Command line (module docstring); exit status 2 without a CUDA GPU."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=("rows", "v", "nvfp4"), default="rows")
    p.add_argument("--shape", default="4,32,4096", help="B,H,S of the BF16 [B, H, S, 128] input")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("quant_profile: needs a CUDA GPU (the Triton quantizers)", file=sys.stderr)
        return 2
    from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows
    from fp4_attention.backends.triton.quant_nvfp4 import quantize_nvfp4_heads
    from fp4_attention.backends.triton.quant_v import quantize_fp8_v_transposed

    b, h, s = (int(v) for v in a.shape.split(","))
    x = torch.randn(b, h, s, 128, device="cuda").bfloat16()
    fn = {
        "rows": lambda: quantize_fp8_rows(x),
        "v": lambda: quantize_fp8_v_transposed(x, perm16=True),
        "nvfp4": lambda: quantize_nvfp4_heads(x),
    }[a.kernel]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
