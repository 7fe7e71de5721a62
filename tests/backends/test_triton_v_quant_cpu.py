"""V's per-channel scale in the Triton quantizer (``quantize_fp8_v_transposed``: an amax pass, then
the scale and the codes in the quantizing pass) without a GPU, interpreted (``TRITON_INTERPRET=1``,
in a subprocess: the variable is read when the kernels are defined).

The scales equal ``pow2_ceil(amax_scale(v, (2,), 448))`` exactly, for channels whose amax / 448 is
normal, subnormal (down to bf16's smallest subnormal) or a power of two, all-zero channels (scale 1)
and channels holding a NaN or an Inf (NaN), in any strides; the codes of a non-finite channel are
0x7F. The codes themselves need the hardware's FP8 conversion: test_triton_quant.py on the GPU.
"""

from __future__ import annotations


def _interpreted_checks() -> list[str]:
    import torch

    from fp4_attention.backends.triton.quant_v import quantize_fp8_v_transposed
    from fp4_attention.numerics.quant import amax_scale, pow2_ceil
    from tests.dispatch_ops import FILL_OPS, OpNames

    failed = []
    g = torch.Generator().manual_seed(0)
    v = torch.randn(2, 3, 70, 64, generator=g) * torch.exp(torch.randn(2, 3, 1, 64, generator=g) * 4)
    v[0, 0, :, 0] = 0.0  # all-zero channel
    v[0, 0, 5, 1] = float("nan")
    v[0, 1, 9, 2] = float("-inf")
    v[1, 0, :, 4] = 0.0
    v[1, 0, 8, 4] = 448.0 * 2.0**-100  # amax / 448 a power of two
    v16 = v.bfloat16()
    # FP32 input: amax / 448 subnormal in FP32, down to its smallest (the interpreter flushes BF16
    # subnormals to zero when it converts them, the GPU does not: test_triton_quant.py has them)
    v32 = v16.float()
    v32[1, 0, :, 3] = 0.0
    v32[1, 0, 7, 3] = 2.0**-133
    v32[1, 1, :, 5] = 0.0
    v32[1, 1, 3, 5] = -3.0 * 2.0**-140
    v32[1, 2, :, 6] = 0.0
    v32[1, 2, 4, 6] = 448.0 * 2.0**-149  # amax / 448 the smallest subnormal, a power of two
    cases = []
    for dtype, x in (("bf16", v16), ("fp32", v32)):
        cases += [
            (f"{dtype} contiguous", x),
            (f"{dtype} sbhd view", x.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)),
        ]
    for name, x in cases:
        want = pow2_ceil(amax_scale(x, (2,), 448.0)[0])
        for perm16 in (False, True):
            got = quantize_fp8_v_transposed(x, perm16=perm16)
            if not (
                torch.equal(got.scale.isnan(), want.isnan())
                and torch.equal(got.scale.nan_to_num(), want.nan_to_num())
            ):
                bad = (got.scale.nan_to_num(-1) != want.nan_to_num(-1)).nonzero()[:4].tolist()
                failed.append(f"{name} perm16={perm16}: scales differ at {bad}")
            codes = got.data.view(torch.uint8)  # [B, H, D, S(16)]
            if not (bool((codes[0, 0, 1] == 0x7F).all()) and bool((codes[0, 1, 2] == 0x7F).all())):
                failed.append(f"{name} perm16={perm16}: codes of a non-finite channel")
    # the amax pass's loop: programs of 128 and 256 keys over 70 (two or four steps of 64 keys, those
    # past key 70 masked): the same scales
    x = cases[0][1]
    want = pow2_ceil(amax_scale(x, (2,), 448.0)[0])
    for amax_rows in (128, 256):
        got = quantize_fp8_v_transposed(x, perm16=True, amax_rows=amax_rows)
        if not torch.equal(got.scale.nan_to_num(-1.0), want.nan_to_num(-1.0)):
            failed.append(f"amax_rows={amax_rows}: other scales")
    try:
        quantize_fp8_v_transposed(x, amax_rows=96)
        failed.append("amax_rows=96 did not raise")
    except ValueError:
        pass
    try:  # B * H on the grid's y axis, which CUDA caps at 65,535: raised before any launch
        quantize_fp8_v_transposed(torch.zeros(65536, 1, 2, 16, dtype=torch.bfloat16))
        failed.append("B * H = 65,536 did not raise")
    except ValueError as e:
        if "65,535" not in str(e):
            failed.append(f"B * H = 65,536: {e}")
    # the amax and the non-finite flag start from one fill (a launch each on a GPU before)
    with OpNames() as ops:
        quantize_fp8_v_transposed(v16, perm16=True)
    fills = [op for op in ops.names if op in FILL_OPS]
    if fills != ["zeros"]:
        failed.append(f"the accumulators take the fills {fills}, not one")
    return failed


def test_interpreted_v_scales():
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__)


if __name__ == "__main__":
    bad = _interpreted_checks()
    print("\n".join(bad) if bad else "ok")
