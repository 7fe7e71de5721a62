"""The fused dO preparation of the FP8 backwards (``triton.dout_quant``) without a GPU, interpreted
(``TRITON_INTERPRET=1``, in a subprocess: the variable is read when the kernels are defined).

The interpreter's FP8 conversion is not the hardware's round-to-nearest-even (it differs in about
5% of the codes), so the codes themselves are checked against ``backends.dout.quantize_dout`` on
the GPU (test_dout_quant.py). Checked here, exactly: the per-head scale (amax, all-zero and
non-finite heads), the dO^T layout against ``pv_layout.permute_v_for_pv`` of the kernel's own
codes, D against the torch formula on the kernel's own codes, the LSE statistic, the Q-scale
vectors, the padding, the non-finite head's canonical code; and the dK operand BF16(q8 * Q scale *
2^-8) (either BF16 rounding: ``tests/interp_rounding.py``).
"""

from __future__ import annotations


def _interpreted_checks() -> list[str]:
    import torch

    from fp4_attention.backends.dout import lse_stat, quantize_dout
    from fp4_attention.backends.pv_layout import permute_v_for_pv
    from fp4_attention.backends.triton.dout_quant import quantize_dout_fused
    from fp4_attention.numerics.quant import pow2_ceil
    from tests.dispatch_ops import FILL_OPS, OpNames
    from tests.interp_rounding import bf16_either_rounding

    failed = []
    g = torch.Generator().manual_seed(0)
    for b, hq, hkv, sq, d, pad in ((1, 4, 2, 100, 64, 64), (2, 2, 2, 130, 128, 64), (1, 2, 1, 64, 64, 1)):
        dout = torch.randn(b, hq, sq, d, generator=g).bfloat16()
        out = torch.randn(b, hq, sq, d, generator=g).bfloat16()
        vs = pow2_ceil(torch.rand(b, hkv, d, generator=g) * 0.1 + 1e-3).contiguous()
        lse = torch.randn(b, hq, sq, generator=g)
        lse[0, 0, 3] = -torch.inf  # a row without keys
        qs = torch.rand(b, hq, sq, generator=g)
        if b == 2:
            dout[1, 1, 5, 7] = float("nan")  # a non-finite head
            dout[0, 1] = 0.0  # an all-zero head
        case = f"B{b} H{hq}/{hkv} S{sq} D{d} pad {pad}"
        q8 = (torch.randn(b, hq, sq, d, generator=g) * 100).to(torch.float8_e4m3fn)
        q8.view(torch.uint8)[0, 0, 1, :2] = torch.tensor([0x7F, 0xFE], dtype=torch.uint8)  # NaN, -448
        kw = dict(lift=8, pad_to=pad, transposed=True, q_scale=qs, qk_scale_log2=0.3, q8=q8)
        got = quantize_dout_fused(dout, out, vs, lse, **kw)
        # BF16(q * Q scale * 2^-8): the token scale in the dK operand, reference_backward's fp8
        if not bf16_either_rounding(got.qb, q8.float() * (qs * 2.0**-8).unsqueeze(-1)):
            failed.append(f"{case}: BF16 dK operand of Q")
        # dO read in place from [B, S, H, D] memory and O from [S, B, H, D] memory: the same results
        do_s = dout.transpose(1, 2).contiguous().transpose(1, 2)
        o_s = out.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
        got_s = quantize_dout_fused(
            do_s, o_s, vs, lse, lift=8, pad_to=pad, transposed=True, q_scale=qs, qk_scale_log2=0.3, q8=q8
        )
        same = [
            torch.equal(a.view(torch.uint8), b.view(torch.uint8))
            for a, b in ((got.do_q.data, got_s.do_q.data), (got.dot, got_s.dot))
        ]
        same.append(torch.equal(got.delta.nan_to_num(7.0), got_s.delta.nan_to_num(7.0)))
        if not all(same):
            failed.append(f"{case}: strided dO / O")
        _, ref_s, _ = quantize_dout(dout, out, vs)
        if not torch.equal(got.s_do.nan_to_num(-1.0), ref_s.nan_to_num(-1.0)):
            failed.append(f"{case}: scale")
        codes = got.do_q.data.view(torch.uint8)
        bad_head = ref_s.isnan()
        if not bool((codes[bad_head] == 0x7F).all()):
            failed.append(f"{case}: code of a non-finite head")
        if not torch.equal(
            permute_v_for_pv(got.do_q.data.transpose(-1, -2)).view(torch.uint8), got.dot.view(torch.uint8)
        ):
            failed.append(f"{case}: dO^T layout")
        vq = vs.repeat_interleave(hq // hkv, dim=1).unsqueeze(2)
        own = ((got.do_q.data.float() * got.do_q.scale) * out.float() / vq).sum(-1)
        if not torch.allclose(got.delta[..., :sq], own, rtol=1e-4, atol=1e-6, equal_nan=True):
            failed.append(f"{case}: D")
        stat = lse_stat(lse, 8)
        if not torch.allclose(got.stat[..., :sq], stat, rtol=1e-6, atol=0.0, equal_nan=True):
            failed.append(f"{case}: stat")
        if not (torch.allclose(got.r[..., :sq], qs * 0.3) and torch.equal(got.row[..., :sq], qs * 2.0**-8)):
            failed.append(f"{case}: r, row")
        spad = -(-sq // pad) * pad
        pads = (got.delta[..., sq:], got.r[..., sq:], got.row[..., sq:])
        if got.stat.shape[-1] != spad or not all(bool((t == 0).all()) for t in pads):
            failed.append(f"{case}: padding")
        if not bool((got.stat[..., sq:] == -torch.inf).all()):
            failed.append(f"{case}: stat padding")
    # the per-head amax and non-finite flag start from one fill (a launch each on a GPU before)
    with OpNames() as ops:
        quantize_dout_fused(dout, out, vs, lse, lift=8, pad_to=pad, transposed=True, q_scale=qs, q8=q8)
    fills = [op for op in ops.names if op in FILL_OPS]
    if fills != ["zeros"]:
        failed.append(f"the accumulators take the fills {fills}, not one")
    # the caller's zeroed words instead (the CuTe backward's accumulator fill): no fill of its own,
    # the same bytes (the last case has a non-finite head and an all-zero one: both words used)
    kw = dict(lift=8, pad_to=pad, transposed=True, q_scale=qs, q8=q8)
    want = quantize_dout_fused(dout, out, vs, lse, **kw)
    zeroed = torch.zeros(2 * b * hq + 3)[3:]  # an offset view: the words need not start the storage
    with OpNames() as ops:
        got = quantize_dout_fused(dout, out, vs, lse, zeroed=zeroed, **kw)
    if [op for op in ops.names if op in FILL_OPS]:
        failed.append("zeroed: a fill of its own")
    same = [
        torch.equal(a.view(torch.uint8), c.view(torch.uint8))
        for a, c in ((got.do_q.data, want.do_q.data), (got.dot, want.dot))
    ]
    same += [
        torch.equal(a.nan_to_num(7.0), c.nan_to_num(7.0))
        for a, c in ((got.s_do, want.s_do), (got.delta, want.delta))
    ]
    if not all(same):
        failed.append(f"zeroed: other results {same}")
    for bad in (torch.zeros(2 * b * hq + 1), torch.zeros(2 * b * hq, dtype=torch.int32)):
        try:
            quantize_dout_fused(dout, out, vs, lse, zeroed=bad, **kw)
            failed.append(f"zeroed {bad.dtype} {tuple(bad.shape)} not refused")
        except ValueError as err:
            if "zeroed must be a contiguous FP32" not in str(err):
                failed.append(f"zeroed: {err}")
    return failed


def test_interpreted_dout_preparation():
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__)


if __name__ == "__main__":
    bad = _interpreted_checks()
    print("\n".join(bad) if bad else "ok")
