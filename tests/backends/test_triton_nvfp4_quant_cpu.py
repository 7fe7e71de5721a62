"""The NVFP4 Q/K quantizer with its per-head global scale formed in the kernels
(``quantize_nvfp4_heads``: a per-head amax pass, then the rows) without a GPU, interpreted
(``TRITON_INTERPRET=1``, in a subprocess: the variable is read when the kernels are defined).

The global scale equals ``nvfp4_global_scale(x, dims=(2, 3))`` exactly (amax / 2688; 1 for an
all-zero head; NaN for a head holding a NaN or an Inf), for contiguous tensors and the [B, H, S, D]
views of [B, S, H, D] and [S, B, H, D] memory, and so does each token's entry of the per-token vector
written beside it; the payload, block scales and decode equal those of
``quantize_nvfp4_rows`` given that scale (the same kernel, interpreted: the codes against the
reference need the hardware's FP8 conversion, test_triton_quant.py on the GPU); one fill.
"""

from __future__ import annotations


def _interpreted_checks() -> list[str]:
    import torch

    from fp4_attention.backends.triton.quant import (
        decode_nvfp4_rows,
        quantize_nvfp4_heads,
        quantize_nvfp4_rows,
    )
    from fp4_attention.numerics.quant import nvfp4_global_scale
    from tests.dispatch_ops import FILL_OPS, OpNames

    failed = []
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 70, 64, generator=g) * torch.exp(torch.randn(2, 3, 1, 1, generator=g) * 4)
    x[0, 1] = 0.0  # all-zero head
    x[1, 0, 5, 7] = float("nan")
    x[1, 2, 9, 2] = float("-inf")
    x = x.bfloat16()
    for name, perm in (("contiguous", None), ("bshd view", (0, 2, 1, 3)), ("sbhd view", (2, 0, 1, 3))):
        t = x if perm is None else x.permute(*perm).contiguous().permute(*[perm.index(i) for i in range(4)])
        with OpNames() as ops:
            got, dec, tok = quantize_nvfp4_heads(t)
        fills = [op for op in ops.names if op in FILL_OPS]
        if fills != ["zeros"]:
            failed.append(f"{name}: fills {fills}, not one")
        want_g = nvfp4_global_scale(x, dims=(2, 3))
        gs = got.global_scale
        if gs.shape != want_g.shape or not (
            torch.equal(gs.isnan(), want_g.isnan()) and torch.equal(gs.nan_to_num(), want_g.nan_to_num())
        ):
            failed.append(f"{name}: global scale {gs.flatten().tolist()} != {want_g.flatten().tolist()}")
            continue
        want_tok = want_g.reshape(2, 3, 1).expand(2, 3, 70)
        if not (tok.is_contiguous() and torch.equal(tok.nan_to_num(-1.0), want_tok.nan_to_num(-1.0))):
            failed.append(f"{name}: per-token scales")
        ref, ref_dec = quantize_nvfp4_rows(x, want_g)
        for part in ("payload", "block_scale"):
            if not torch.equal(getattr(got, part), getattr(ref, part)):
                failed.append(f"{name}: {part}")
        same_dec = torch.equal(dec.isnan(), ref_dec.isnan()) and torch.equal(
            dec.nan_to_num(), ref_dec.nan_to_num()
        )
        if not same_dec:
            failed.append(f"{name}: decode")
        redec = decode_nvfp4_rows(got)  # the standalone decode of the saved tensor: the same values
        if not (
            torch.equal(redec.isnan(), dec.isnan()) and torch.equal(redec.nan_to_num(), dec.nan_to_num())
        ):
            failed.append(f"{name}: decode_nvfp4_rows differs from the quantizer's decode")
    return failed


def test_interpreted_nvfp4_heads():
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__)


if __name__ == "__main__":
    bad = _interpreted_checks()
    print("\n".join(bad) if bad else "ok")
