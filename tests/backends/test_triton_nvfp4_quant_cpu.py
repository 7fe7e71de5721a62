"""The NVFP4 Q/K quantizer with its per-head global scale formed in the kernels
(``quantize_nvfp4_heads``: a per-head amax pass, then the rows) without a GPU, interpreted
(``TRITON_INTERPRET=1``, in a subprocess: the variable is read when the kernels are defined).

The global scale equals ``nvfp4_global_scale(x, dims=(2, 3))`` exactly (amax / 2688; 1 for an
all-zero head; NaN for a head holding a NaN or an Inf), for contiguous tensors and the [B, H, S, D]
views of [B, S, H, D] and [S, B, H, D] memory, and so does each token's entry of the per-token vector
written beside it; the payload, block scales and decode equal those of
``quantize_nvfp4_rows`` given that scale (the same kernel, interpreted: the codes against the
reference need the hardware's FP8 conversion, test_triton_quant.py on the GPU); one fill. The
decodes (the quantizer's and ``decode_nvfp4_rows``) equal ``scaled_payload()`` in BF16 bit for bit,
the sign of zero included (E2M1 code 8 is -0), and the Triton backend's Q/K kernel operands without
a decoded pair at hand decode the saved Q/K to those bits. The launch options of the Q/K
quantizers (rows per program, warps, blocks per program: ``bench/quant_bench.py``'s sweeps) do not
change their bytes;
the amax pass's words given by the caller (``zeroed``) make no fill and the same bytes.
"""

from __future__ import annotations


def _bits(t):
    """BF16 bit patterns, every NaN as one pattern."""
    import torch

    return torch.where(t.isnan(), torch.full_like(t, float("nan")), t).view(torch.int16)


def _interpreted_checks() -> list[str]:
    import torch

    from fp4_attention.backends.triton.quant_nvfp4 import (
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
    x[0, 0, 0, :16] = -1e-6  # a block of tiny negatives and one large entry: codes 8 (-0)
    x[0, 0, 0, 15] = 1.0
    x = x.bfloat16()
    want_g = nvfp4_global_scale(x, dims=(2, 3))
    ref, ref_dec = quantize_nvfp4_rows(x, want_g)  # once: every layout below holds the same x
    for name, perm in (("contiguous", None), ("bshd view", (0, 2, 1, 3)), ("sbhd view", (2, 0, 1, 3))):
        t = x if perm is None else x.permute(*perm).contiguous().permute(*[perm.index(i) for i in range(4)])
        with OpNames() as ops:
            got, dec, tok = quantize_nvfp4_heads(t)
        fills = [op for op in ops.names if op in FILL_OPS]
        if fills != ["zeros"]:
            failed.append(f"{name}: fills {fills}, not one")
        gs = got.global_scale
        if gs.shape != want_g.shape or not (
            torch.equal(gs.isnan(), want_g.isnan()) and torch.equal(gs.nan_to_num(), want_g.nan_to_num())
        ):
            failed.append(f"{name}: global scale {gs.flatten().tolist()} != {want_g.flatten().tolist()}")
            continue
        want_tok = want_g.reshape(2, 3, 1).expand(2, 3, 70)
        if not (tok.is_contiguous() and torch.equal(tok.nan_to_num(-1.0), want_tok.nan_to_num(-1.0))):
            failed.append(f"{name}: per-token scales")
        for part in ("payload", "block_scale"):
            if not torch.equal(getattr(got, part), getattr(ref, part)):
                failed.append(f"{name}: {part}")
        same_dec = torch.equal(dec.isnan(), ref_dec.isnan()) and torch.equal(
            dec.nan_to_num(), ref_dec.nan_to_num()
        )
        if not same_dec:
            failed.append(f"{name}: decode")
        want_bits = _bits(got.scaled_payload().bfloat16())
        for what, t in (("the quantizer's decode", dec), ("decode_nvfp4_rows", decode_nvfp4_rows(got))):
            if not torch.equal(_bits(t), want_bits):
                failed.append(f"{name}: {what} differs from scaled_payload() in BF16 (bits)")
    if not bool(((got.payload & 0xF) == 8).any()):
        failed.append("the input has no -0 code to check")
    # the rows API given a negative, a +Inf and a subnormal global scale: the decode is the payload's
    # (x's sign times a negative s_b), +Inf poisons its head's blocks as the reference's does, and
    # the subnormal one saturates the block scales (448) and the codes (+-6) as the reference's
    from fp4_attention.numerics.quant import quantize_nvfp4

    gs = nvfp4_global_scale(x, dims=(2, 3)).clone()
    gs[0, 0], gs[0, 2], gs[1, 1] = -gs[0, 0], float("inf"), 2.0**-140
    got2, dec2 = quantize_nvfp4_rows(x, gs)
    ref2 = quantize_nvfp4(x, gs)
    if not torch.equal(_bits(dec2), _bits(got2.scaled_payload().bfloat16())):
        failed.append("rows with odd global scales: decode differs from scaled_payload() (bits)")
    for h in ((0, 2), (1, 1)):
        same = torch.equal(got2.block_scale[h], ref2.block_scale[h]) and torch.equal(
            got2.payload[h], ref2.payload[h]
        )
        if not same:
            failed.append(f"rows with global scale {float(gs[h])}: bytes differ from the reference")
    if not bool((got2.block_scale[0, 2] == 0x7F).all()):
        failed.append("an Inf global scale did not poison its head")
    # the Triton backend's Q/K operands without the decoded pair: the Triton decode of the saved Q/K
    from fp4_attention import get_recipe
    from fp4_attention.backends.triton import backend as tb

    k_s = quantize_nvfp4_heads(x[:, :1].contiguous())[0]
    q_op, k_op, _, _ = tb._qk_kernel_operands(got, k_s, get_recipe("nvfp4qk_fp8pv"), x.shape, (2, 1, 70, 64))
    for part, op, saved in (("q_op", q_op, got), ("k_op", k_op, k_s)):
        if not torch.equal(_bits(op), _bits(saved.scaled_payload().bfloat16())):
            failed.append(f"Q/K kernel operands without a decoded pair: {part}")
    from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows

    # one block of rows per program as the base: the rows below run at the default, 2 blocks
    base_nv, base_fp8 = quantize_nvfp4_heads(x, blocks=1), quantize_fp8_rows(x, blocks=1)
    for rows, warps in ((4, 8), (32, 2)):
        nv, f8 = (
            quantize_nvfp4_heads(x, rows=rows, num_warps=warps),
            quantize_fp8_rows(x, rows=rows, num_warps=warps),
        )
        if not (
            torch.equal(nv[0].payload, base_nv[0].payload)
            and torch.equal(nv[0].block_scale, base_nv[0].block_scale)
        ):
            failed.append(f"nvfp4 heads at rows={rows} warps={warps}: other bytes")
        if not torch.equal(f8.data.view(torch.uint8), base_fp8.data.view(torch.uint8)):
            failed.append(f"fp8 rows at rows={rows} warps={warps}: other bytes")
    # blocks of rows per program (the next block's loads first; 70 rows: the last program's later
    # blocks partly or wholly past the end): the same bytes, decode and scales
    for rows, blocks in ((8, 2), (16, 4), (4, 4), (32, 1)):
        nv = quantize_nvfp4_heads(x, rows=rows, blocks=blocks)
        same = all(
            torch.equal(a, b)
            for a, b in (
                (nv[0].payload, base_nv[0].payload),
                (nv[0].block_scale, base_nv[0].block_scale),
                (_bits(nv[1]), _bits(base_nv[1])),
                (nv[2].nan_to_num(-1.0), base_nv[2].nan_to_num(-1.0)),
                (nv[0].global_scale.nan_to_num(-1.0), base_nv[0].global_scale.nan_to_num(-1.0)),
            )
        )
        if not same:
            failed.append(f"nvfp4 heads at rows={rows} blocks={blocks}: other bytes")
    try:
        quantize_nvfp4_heads(x, blocks=3)
        failed.append("blocks=3 did not raise")
    except ValueError:
        pass
    # grids: B * H on the amax pass's y axis (heads), B and H on the rows kernel's z and y axes
    # (a strided 4-D x), each capped at 65,535 by CUDA; raised before any launch
    wide = torch.zeros(65536, 1, 2, 16, dtype=torch.bfloat16)
    for what, call in (
        ("heads, B * H = 65,536", lambda: quantize_nvfp4_heads(wide)),
        (
            "rows, B = 65,536",
            lambda: quantize_nvfp4_rows(
                torch.zeros(65536, 2, 2, 16, dtype=torch.bfloat16).transpose(1, 2), torch.ones(1)
            ),
        ),
    ):
        try:
            call()
            failed.append(f"{what}: did not raise")
        except ValueError as e:
            if "65,535" not in str(e):
                failed.append(f"{what}: {e}")
    for bad in (3, 0):
        try:
            quantize_fp8_rows(x, rows=bad)
            failed.append(f"rows={bad} did not raise")
        except ValueError:
            pass
    # the amax pass's words from the caller's fill (the cute forward zeroes the three amax passes'
    # words in one launch): no fill of its own, the same bytes; a wrong buffer is refused
    zeroed = torch.zeros(2 * 2 * 3)
    with OpNames() as ops:
        given = quantize_nvfp4_heads(x, zeroed=zeroed)
    if [op for op in ops.names if op in FILL_OPS]:
        failed.append(f"zeroed given: fills {[op for op in ops.names if op in FILL_OPS]}")
    same_tok = torch.equal(given[2].nan_to_num(-1.0), base_nv[2].nan_to_num(-1.0))  # a NaN head's NaN
    if not (torch.equal(given[0].payload, base_nv[0].payload) and same_tok):
        failed.append("zeroed given: other bytes or per-token scales")
    for bad_words in (torch.zeros(11), torch.zeros(12, dtype=torch.float64), torch.zeros(24)[::2]):
        try:
            quantize_nvfp4_heads(x, zeroed=bad_words)
            failed.append(f"zeroed {bad_words.dtype} {tuple(bad_words.shape)} did not raise")
        except ValueError as e:
            if "zeroed must be a contiguous FP32 [12]" not in str(e):
                failed.append(f"zeroed: {e}")
    return failed


def test_interpreted_nvfp4_heads():
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__)


if __name__ == "__main__":
    bad = _interpreted_checks()
    print("\n".join(bad) if bad else "ok")
