"""The Triton RoPE kernels without a GPU, interpreted (``TRITON_INTERPRET=1``, in a subprocess: the
variable is read when the kernels are defined): ``rope_rows`` equals ``numerics.rope.apply_rope`` and
``rope_grad`` to the bit (NaN where they give NaN), ``rope_rows_pair`` (two tensors, one launch)
equals them too, and ``quantize_fp8_rows_pair_rope`` equals
``quantize_fp8_rows_pair`` of the reference's RoPE'd Q and K byte for byte (the interpreter's FP8
conversion is not the GPU's: it rounds ties away and can lose a carry, so the interpreted fused kernel
is compared with the interpreted unfused one; ``tests/backends/test_triton_rope.py`` compares the GPU's
bytes with the reference's), for Q and K of different heads, lengths and layouts (read in
place from ``[S, B, H, D]`` memory), head counts that are not a multiple of the heads per program,
lengths that are not a multiple of the positions per program, both FP8 formats, NaN/Inf rows (and,
for ``quantize_nvfp4_heads_rope``, the poisoned heads and an all-zero one), and
angles large enough that the products round differently with an FMA; and the refusals."""

from __future__ import annotations


def _interpreted_checks() -> list[str]:
    import torch

    from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows_pair
    from fp4_attention.backends.triton.quant_nvfp4 import quantize_nvfp4_heads
    from fp4_attention.backends.triton.rope import (
        quantize_fp8_rows_pair_rope,
        quantize_nvfp4_heads_rope,
        rope_rows,
        rope_rows_pair,
    )
    from fp4_attention.numerics.rope import apply_rope, rope_grad, rope_tables

    def same(a, b) -> bool:
        return torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) and torch.equal(
            a.scale.nan_to_num(), b.scale.nan_to_num()
        )

    def same_values(a, b) -> bool:  # NaN where the other is NaN (its bits are the platform's)
        return torch.equal(a.float().nan_to_num(7.0), b.float().nan_to_num(7.0)) and torch.equal(
            a.isnan(), b.isnan()
        )

    # uninitialized outputs filled (NaN, or the integer maximum): an element a kernel fails to write
    # cannot hold the right value left in reused memory by an earlier call
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    failed = []
    g = torch.Generator().manual_seed(0)
    sq, sk, d = 37, 21, 64
    pos = torch.arange(max(sq, sk), dtype=torch.float32)
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = pos[:, None] * inv[None, :] * 100.0  # large angles: every cos/sin value used
    cq, sq_tab = rope_tables(angles[:sq])
    ck, sk_tab = rope_tables(angles[:sk])
    # Q as megatron-core holds it, [S, B, H, D], seen as [B, H, S, D]: read in place
    q = (torch.randn(sq, 2, 6, d, generator=g) * 3).bfloat16().permute(1, 2, 0, 3)
    k = torch.randn(2, 3, sk, d, generator=g).mul(torch.exp(torch.randn(2, 3, sk, 1, generator=g)))
    q[1, 2, 5, 7] = float("nan")
    k[0, 1, 3, 1] = float("inf")
    for name, x, (c, s) in (("q", q, (cq, sq_tab)), ("k fp32", k, (ck, sk_tab))):
        for heads, rows in ((4, 16), (1, 8), (5, 64)):
            if not same_values(rope_rows(x, c, s, rows=rows, heads=heads), apply_rope(x, c, s)):
                failed.append(f"rope_rows {name} heads={heads} rows={rows}")
        if not same_values(rope_rows(x, c, s, grad=True), rope_grad(x, c, s)):
            failed.append(f"rope_rows grad {name}")
    # Q (BF16, [S, B, H, D] memory) and K (FP32) of other heads and lengths in one launch, both ways
    for grad, fn in ((False, apply_rope), (True, rope_grad)):
        for heads, rows in ((4, 16), (5, 8)):
            yq, yk = rope_rows_pair(q, k, (cq, sq_tab), (ck, sk_tab), grad=grad, rows=rows, heads=heads)
            if not (same_values(yq, fn(q, cq, sq_tab)) and same_values(yk, fn(k, ck, sk_tab))):
                failed.append(f"rope_rows_pair grad={grad} heads={heads} rows={rows}")
            if yq.stride() != q.stride() or not yk.is_contiguous():  # each in its input's memory order
                failed.append(f"rope_rows_pair grad={grad}: strides {yq.stride()} {yk.stride()}")
    try:  # one head dim for both
        rope_rows_pair(q, k[..., :32], (cq, sq_tab), (ck[:, :16], sk_tab[:, :16]))
        failed.append("rope_rows_pair: two head dims not refused")
    except ValueError as err:
        if "one head dim and one device" not in str(err):
            failed.append(f"rope_rows_pair: {err}")
    for fmt in ("e4m3", "e5m2"):
        for heads, rows in ((4, 16), (3, 8)):
            got = quantize_fp8_rows_pair_rope(q, k, (cq, sq_tab), (ck, sk_tab), fmt, rows=rows, heads=heads)
            want = quantize_fp8_rows_pair(apply_rope(q, cq, sq_tab), apply_rope(k, ck, sk_tab), fmt)
            for part, a, b in (("q", got[0], want[0]), ("k", got[1], want[1])):
                if not same(a, b):
                    failed.append(f"pair {fmt} heads={heads} rows={rows} {part}")
                if a.data.shape != b.data.shape or a.scale.shape != b.scale.shape:
                    failed.append(f"pair {fmt} {part}: shapes")
    # NVFP4 (nvfp4qk_fp8pv's Q/K): both passes with RoPE against the unfused quantizer on apply_rope
    kz = k.clone()
    kz[1] = 0.0  # an all-zero batch: global scale 1
    for name, x, (c, s) in (("q", q, (cq, sq_tab)), ("k", kz, (ck, sk_tab))):
        want, want_dec, want_tok = quantize_nvfp4_heads(apply_rope(x, c, s))
        for heads, rows in ((None, None), (4, 8), (1, 64)):
            got, dec, tok = quantize_nvfp4_heads_rope(x, c, s, rows=rows, heads=heads)
            ok = (
                torch.equal(got.payload, want.payload)
                and torch.equal(got.block_scale, want.block_scale)
                and same_values(got.global_scale, want.global_scale)
                and same_values(dec, want_dec)
                and same_values(tok, want_tok)
            )
            if not ok:
                failed.append(f"nvfp4 {name} heads={heads} rows={rows}")
    return failed


def test_interpreted_rope_kernels_equal_the_reference():
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__)


def test_bad_tables_and_head_dims_are_refused():
    import pytest
    import torch

    from fp4_attention.backends.triton import rope

    x = torch.randn(1, 2, 8, 64)
    c = torch.zeros(8, 32)
    with pytest.raises(ValueError, match="needs a 4-D"):
        rope.rope_rows(x, c, c)  # a CPU tensor outside the interpreter
    # the checks that do not depend on the device
    with pytest.raises(ValueError, match=r"cos must be a contiguous FP32 \[8, 32\]"):
        rope._check_tables(x, torch.zeros(8, 64), c, "t")
    with pytest.raises(ValueError, match=r"sin must be a contiguous FP32"):
        rope._check_tables(x, c, c.double(), "t")
    with pytest.raises(ValueError, match="heads per program must be >= 1"):
        rope._heads_option(0)


if __name__ == "__main__":
    bad = _interpreted_checks()
    print("\n".join(bad) if bad else "ok")
