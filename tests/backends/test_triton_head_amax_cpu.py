"""The per-head amax pass (``quant._head_amax_kernel``) through the integer max of the BF16 bits
(``BF16_BITS``) writes the words of its float path, interpreted (``TRITON_INTERPRET=1``, in a
subprocess: the variable is read when the kernels are defined): on every BF16 bit pattern (NaN and
Inf of both signs, subnormals, -0), on a head of subnormals, on one whose last block holds a -Inf,
read through the strides of a [B, S, H, D] view; and both equal torch's amax and flags.
"""

from __future__ import annotations


def _interpreted_checks() -> list[str]:
    import torch

    from fp4_attention.backends.triton import quant

    failed = []
    d, s = 128, 512
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    x = torch.stack(
        [
            every.reshape(s, d),  # every pattern: negative ones in the first half, positive in the second
            (torch.randn(s, d, generator=g) * 1e-38).bfloat16(),  # subnormals and zeros
            (torch.randn(s, d, generator=g) * 3).bfloat16(),  # finite, then one -Inf in its last block
        ]
    )[None]  # [1, 3, S, D]
    x[0, 2, 17] = -0.0
    x[0, 2, 500, 5] = float("-inf")
    # read through the strides of a [B, S, H, D] tensor, as the quantizer reads Q and K
    t = x.transpose(1, 2).contiguous().transpose(1, 2)
    words = []
    for bits in (False, True):
        amax, bad = quant.zeroed_amax_and_flag((3,), t.device)
        quant._head_amax_kernel[(s // 64, 3)](
            t, amax, bad, 3, s, *t.stride()[:3], D=d, BLOCK_S=64, BF16_BITS=bits
        )
        words.append((amax.view(torch.int32).tolist(), bad.tolist()))
    if words[0] != words[1]:
        failed.append(f"float path {words[0]}, BF16 bits {words[1]}")
    blocks = x.float().abs().reshape(3, s // 64, 64 * d)
    finite = blocks.isfinite().all(-1)
    want_bad = (~finite).any(-1).int().tolist()
    want_amax = torch.where(finite, blocks.amax(-1), 0.0).amax(-1)
    if words[1] != (want_amax.view(torch.int32).tolist(), want_bad):
        failed.append(f"{words[1]} against torch {want_amax.tolist()} {want_bad}")
    # head 0's blocks holding 0x7F7F (the largest finite) also hold Inf and NaNs: its amax is the
    # largest pattern of the blocks before them
    if want_bad != [1, 0, 1] or not 1e19 < want_amax[0] < float("inf"):
        failed.append(f"flags {want_bad}, amax {want_amax.tolist()}: not the inputs meant")
    return failed


def test_bf16_bits_equal_float_path():
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__)


if __name__ == "__main__":
    bad = _interpreted_checks()
    print("\n".join(bad) if bad else "ok")
