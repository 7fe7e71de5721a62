"""Q and K quantized in one launch (``quant.quantize_fp8_rows_pair``) without a GPU, interpreted
(``TRITON_INTERPRET=1``, in a subprocess: the variable is read when the kernels are defined): the
bytes of two ``quantize_fp8_rows`` calls, for tensors of different heads, lengths, layouts (read in
place from ``[B, S, H, D]`` memory) and dtypes, in both FP8 formats, with a rotation's signs, with
NaN/Inf rows and a row count that is not a multiple of the rows per program, at 1, 2 and 4 blocks of
rows per program (``blocks``); the same launch zeroing
another buffer (``zero``, the cute forward's V amax words) of any length; and the refusal of two
head dims."""

from __future__ import annotations


def _interpreted_checks() -> list[str]:
    import torch

    from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows, quantize_fp8_rows_pair
    from fp4_attention.numerics.rotation import hadamard_signs

    def same(a, b) -> bool:
        return torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) and torch.equal(
            a.scale.nan_to_num(), b.scale.nan_to_num()
        )

    failed = []
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(2, 4, 37, 64, generator=g) * torch.exp(torch.randn(2, 4, 37, 1, generator=g))).bfloat16()
    k = torch.randn(2, 23, 1, 64, generator=g).mul(3).transpose(1, 2)  # [B, H, S, D] view of [B, S, H, D]
    q[1, 2, 5, 7] = float("nan")
    k[0, 0, 3, 1] = float("inf")
    cases = {
        "bf16 q, strided fp32 k": (q, k, "e4m3", None, None),
        "e5m2, 8 rows per program": (q, k.bfloat16(), "e5m2", None, 8),
        "rotated": (q, k.bfloat16(), "e4m3", hadamard_signs(3, 64), None),
        "k first": (k.contiguous(), q, "e4m3", None, 16),
    }
    for name, (a, b, fmt, signs, rows) in cases.items():
        pair = quantize_fp8_rows_pair(a, b, fmt, signs=signs, rows=rows)  # the default: 2 blocks
        one = (  # one block of rows per program
            quantize_fp8_rows(a, fmt, signs=signs, rows=rows, blocks=1),
            quantize_fp8_rows(b, fmt, signs=signs, rows=rows, blocks=1),
        )
        if not (same(pair[0], one[0]) and same(pair[1], one[1])):
            failed.append(name)
        # blocks of rows per program (the next block's loads first; the last program's later blocks
        # partly or wholly past the end): the same bytes, in the pair and alone
        for blocks in (1, 2, 4):
            pb = quantize_fp8_rows_pair(a, b, fmt, signs=signs, rows=rows, blocks=blocks)
            ob = quantize_fp8_rows(a, fmt, signs=signs, rows=rows, blocks=blocks)
            if not (same(pb[0], one[0]) and same(pb[1], one[1]) and same(ob, one[0])):
                failed.append(f"{name}, {blocks} blocks per program")
        if pair[1].scale.shape != (*b.shape[:-1], 1) or pair[1].data.shape != b.shape:
            failed.append(f"{name}: shapes")
    # the same launch zeroes another buffer (the cute forward's V amax words): more words than one
    # step of the grid-stride loop covers (1024 per program and step), not a multiple of it, and more
    # than the grid's programs reach in one step; the bytes unchanged
    from tests.dispatch_ops import FILL_OPS, OpNames

    for n_words, rows in ((2500, None), (1024 * 40 + 3, 64)):
        buf = torch.full((n_words,), float("nan"))
        with OpNames() as ops:
            pair = quantize_fp8_rows_pair(q, k, rows=rows, zero=buf)
        one = quantize_fp8_rows_pair(q, k, rows=rows)
        if not (same(pair[0], one[0]) and same(pair[1], one[1])):
            failed.append(f"zero {n_words}: other bytes")
        if not (buf == 0).all():
            failed.append(f"zero {n_words}: {int((buf != 0).sum())} words not zeroed")
        if [op for op in ops.names if op in FILL_OPS]:
            failed.append(f"zero {n_words}: a fill launch")
    for bad in (torch.zeros(8, dtype=torch.float64), torch.zeros(16)[::2]):
        try:
            quantize_fp8_rows_pair(q, k, zero=bad)
            failed.append(f"zero {bad.dtype} strides {bad.stride()}: not refused")
        except ValueError as e:
            if "zero must be a contiguous FP32 tensor" not in str(e):
                failed.append(f"zero refused with: {e}")
    for bad in (3, True, 2.0):
        try:
            quantize_fp8_rows(q, blocks=bad)
            failed.append(f"blocks={bad!r} not refused")
        except ValueError as e:
            if "must be 1, 2 or 4" not in str(e):
                failed.append(f"blocks={bad!r} refused with: {e}")
    return failed


def test_interpreted_pair_quantizer_equals_two_calls():
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__)


def test_tensors_of_two_head_dims_are_refused():
    import pytest
    import torch

    from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows_pair

    with pytest.raises(ValueError, match="one head dim and one device, got 64 on cpu and 32 on cpu"):
        quantize_fp8_rows_pair(torch.randn(2, 4, 8, 64), torch.randn(2, 1, 8, 32))


if __name__ == "__main__":
    bad = _interpreted_checks()
    print("\n".join(bad) if bad else "ok")
