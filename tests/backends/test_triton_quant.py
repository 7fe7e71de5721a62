"""Triton quantizers: bytes equal the reference quantizers' on the same input.

The reference runs on the CPU copy of the input: torch's CPU kernels divide with IEEE
round-to-nearest, while on the H200 torch's CUDA path gave E4M3 block scales one code off on exact
ties (amax_b / 6 / g = 184.0 exactly, an E4M3 tie, encoded as 176 instead of 192; seen 2026-11-29),
so torch-on-CUDA is not a bit-exact reference. The Triton kernels use ``div_rn`` (IEEE), or where
they avoid it per element the tests below check the same bits against ``div_rn``: V's
power-of-two reciprocal on its whole BF16 domain, the NVFP4 kernel's per-block reciprocal with
``div_rn``'s own fast path on every BF16 x and a sweep of denominators.
"""

import pytest
import torch
import triton
import triton.language as tl

from fp4_attention.numerics.quant import (
    nvfp4_global_scale,
    quantize_fp8,
    quantize_fp8_key_groups,
    quantize_nvfp4,
)
from fp4_attention.numerics.rotation import hadamard_signs, rotate

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_key_groups as key_groups_fast  # noqa: E402
from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows, quantize_fp8_rows_pair
from fp4_attention.backends.triton.quant_nvfp4 import (
    _block_quotients,
    _e2m1_code,
    _e2m1_round,
    _e2m1_value,
    quantize_nvfp4_heads,
    quantize_nvfp4_rows,
)
from fp4_attention.backends.triton.quant_v import POW2_RECIP_MIN_SCALE, _pow2_ceil, quantize_fp8_v_transposed


def _inputs(d, seq=333):
    g = torch.Generator().manual_seed(d)
    x = torch.randn(2, 4, seq, d, generator=g) * torch.exp(torch.randn(2, 4, seq, 1, generator=g) * 3)
    x[0, 0, 5] = 0.0  # zero row
    x[0, 1, 7, :16] = 0.0  # zero block
    x[0, 1, 7, 16:32] *= 1e-9  # underflowing block
    x[1, 2, 9, 3] = -0.0
    return x.bfloat16().cuda()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_rows_bytes_equal_reference(fmt, d, dtype):
    """BF16 and FP32 rows, with tiny and subnormal row scales: the bytes of the reference."""
    x = _inputs(d).to(dtype)
    x[1, 3, 11, 2] = float("nan")
    x[1, 3, 12, 2] = float("inf")
    x[0, 2, 20] *= 2.0**-100  # tiny rows
    x[0, 2, 21] *= 2.0**-80
    x[0, 2, 22] = 0.0
    x[0, 2, 22, 3] = 2.0**-133  # BF16's smallest subnormal: the row scale is an FP32 subnormal
    got = quantize_fp8_rows(x, fmt)
    ref = quantize_fp8(x.cpu(), fmt, dims=(-1,))
    got = type(got)(data=got.data.cpu(), scale=got.scale.cpu())
    assert torch.equal(got.data.view(torch.uint8), ref.data.view(torch.uint8))
    assert torch.equal(got.scale.isnan(), ref.scale.isnan())
    assert torch.equal(got.scale.nan_to_num(), ref.scale.nan_to_num())


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("seq", [333, 4096])
@pytest.mark.parametrize("rotated", [False, True])
def test_fp8_key_groups_bytes_equal_reference(d, seq, rotated):
    """K with one E4M3 scale per 64 keys (recipe option ``k_scale_keys``): the bytes of
    ``numerics.quant.quantize_fp8_key_groups`` (with a rotation: of the FP32 rotated K), BF16 input
    read in place from [B, S, H, D] memory too, with zero, tiny, NaN and Inf groups."""
    x = _inputs(d, seq)
    x[0, 3, 64:128] *= 2.0**-100  # a tiny group
    x[1, 0, 128:192] = 0.0  # an all-zero group
    x[1, 3, 70, 2] = float("nan")
    x[1, 1, seq - 1, 0] = float("inf")  # the last group (short at 333)
    signs = hadamard_signs(7, d, "cuda") if rotated else None
    ref = quantize_fp8_key_groups(rotate(x.cpu(), signs.cpu()) if rotated else x.cpu(), 64)
    for inp in (x, x.transpose(1, 2).contiguous().transpose(1, 2)):
        got = key_groups_fast(inp, 64, signs=signs)
        assert torch.equal(got.data.view(torch.uint8).cpu(), ref.data.view(torch.uint8))
        assert torch.equal(got.scale.isnan().cpu(), ref.scale.isnan())
        assert torch.equal(got.scale.nan_to_num().cpu(), ref.scale.nan_to_num())


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("seq", [333, 4096])
@pytest.mark.parametrize("layout", ["contiguous", "sbhd_view"])
@pytest.mark.parametrize("amax_rows", [None, 256])
def test_fp8_v_transposed_bytes_equal_reference(d, seq, layout, amax_rows):
    """V per channel to E4M3, stored [B, H, D, S]: bytes and power-of-two scales equal
    quantize_fp8(v, dims=(-2,), pow2=True) on the CPU copy, also for the non-contiguous
    [B, H, S, D] view of megatron's [S, B, H, D]; at the amax pass's default launch and at 256 keys
    per program (four steps of its loop, past the end at S 333)."""
    x = _inputs(d, seq)
    x[1, 3, 11, 2] = float("nan")  # poisons channel 2 of head (1, 3)
    x[1, 2, 12, 5] = float("-inf")
    x[0, 2, :, 7] = 0.0  # all-zero channel: scale 1
    x[0, 1, :, 8] = 0.0
    x[0, 1, 3, 8] = 2.0**-133  # BF16's smallest subnormal: amax / 448 is an FP32 subnormal
    x[0, 1, :, 9] = 0.0
    x[0, 1, 4, 9] = -3.0 * 2.0**-128  # a BF16 subnormal, not a power of two
    if layout == "sbhd_view":
        x = x.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    got = quantize_fp8_v_transposed(x, amax_rows=amax_rows)
    ref = quantize_fp8(x.cpu(), "e4m3", dims=(-2,), pow2=True)
    assert got.data.shape == (2, 4, d, seq) and got.data.is_contiguous()
    assert torch.equal(got.data.cpu().view(torch.uint8).transpose(-1, -2), ref.data.view(torch.uint8))
    assert torch.equal(got.scale.cpu().isnan(), ref.scale.isnan())
    assert torch.equal(got.scale.cpu().nan_to_num(), ref.scale.nan_to_num())


def _assert_nvfp4_equal(got, dec, ref):
    """Payload and block scales byte-equal the reference's, the BF16 decode equals its s_b * q."""
    assert torch.equal(got.payload.cpu(), ref.payload)
    assert torch.equal(got.block_scale.cpu(), ref.block_scale)
    sp = ref.scaled_payload()
    dec = dec.cpu()
    assert torch.equal(dec.float().isnan(), sp.isnan())
    assert torch.equal(dec.float().nan_to_num(), sp.nan_to_num())


def _extreme_heads(x):
    """Heads (0, 2) x 2^-100 and (1, 0) x 2^100: block denominators outside the NVFP4 quantizer's
    fast-division range (``quant._block_quotients``), so their programs divide with ``div_rn``."""
    x[0, 2] *= 2.0**-100
    x[1, 0] *= 2.0**100
    return x


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("seq", [333, 4096])
def test_nvfp4_rows_bytes_equal_reference(d, seq):
    x = _extreme_heads(_inputs(d, seq))
    x[1, 3, 11, 40] = float("nan")  # poisons head (1, 3)
    g = nvfp4_global_scale(x.cpu(), dims=(2, 3))
    # NaN and Inf blocks under a finite global scale (head (0, 3)'s, formed before): only their
    # blocks are poisoned, in programs that take the fast division
    x[0, 3, 20, 5] = float("nan")
    x[0, 3, 21, d - 1] = float("-inf")
    got, dec = quantize_nvfp4_rows(x, g.cuda())
    ref = quantize_nvfp4(x.cpu(), g)
    _assert_nvfp4_equal(got, dec, ref)


def test_nvfp4_rows_saturating_global_scale_equals_reference():
    """A global scale 2^40 below the head's own: the block scales saturate at 448 and the quotients
    reach 2^40 (beyond the fast division's bound of 2^32: ``div_rn``), codes +-6; a subnormal global
    scale 2^-140 (denominators below 2^-126, whose reciprocal the fast path would flush: only
    ``div_rn`` gives the reference's bytes there); one head keeps its own scale (fast path), in the
    same launch."""
    x = _inputs(128)
    g = nvfp4_global_scale(x.cpu(), dims=(2, 3))
    g[:, :2] *= 2.0**-40
    g[:, 2] = 2.0**-140
    got, dec = quantize_nvfp4_rows(x, g.cuda())
    ref = quantize_nvfp4(x.cpu(), g)
    assert bool((ref.block_scale[:, :3] == 0x7E).any())  # 448: saturated
    _assert_nvfp4_equal(got, dec, ref)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("seq", [333, 4096])
@pytest.mark.parametrize(
    "perm", [None, (0, 2, 1, 3), (2, 0, 1, 3)], ids=["contiguous", "bshd_view", "sbhd_view"]
)
@pytest.mark.parametrize("blocks", [1, 2, 4])  # blocks of rows per program of the rows kernel
def test_nvfp4_heads_bytes_and_global_scale_equal_reference(d, seq, perm, blocks):
    """The per-head global scale formed in the kernels (``quantize_nvfp4_heads``): payload, block
    scales, global scale and decode equal the reference with ``nvfp4_global_scale(x, dims=(2, 3))``,
    for a head holding a NaN, one holding an Inf, an all-zero one and heads whose global scales are
    near the ends of the fast division's range, read in place from views."""
    x = _extreme_heads(_inputs(d, seq))
    x[1, 3, 11, 40] = float("nan")
    x[1, 2, 3, 5] = float("-inf")
    x[0, 3] = 0.0
    # global scales near the ends of the range in which a program divides through the fast path
    # (about 2^-54 and 2^50 against 2^-55 and 2^51: quant._nvfp4_rows_kernel's test of one scalar)
    for h, g_head in (((0, 1), 2.0**-54), ((1, 1), 2.0**50)):
        x[h] = (x[h].float() * (2688.0 * g_head / x[h].float().abs().max())).bfloat16()
    if perm is not None:
        x = x.permute(*perm).contiguous().permute(*[perm.index(i) for i in range(4)])
        assert not x.is_contiguous()
    got, dec, tok = quantize_nvfp4_heads(x, blocks=blocks)
    ref = quantize_nvfp4(x.cpu(), nvfp4_global_scale(x.cpu(), dims=(2, 3)))
    g, g_ref = got.global_scale.cpu(), ref.global_scale
    assert g.shape == g_ref.shape == (2, 4, 1, 1)
    assert torch.equal(g.isnan(), g_ref.isnan()) and torch.equal(g.nan_to_num(), g_ref.nan_to_num())
    tok_ref = g_ref.reshape(2, 4, 1).expand(2, 4, seq)  # every token carries its head's scale
    assert tok.is_contiguous() and torch.equal(tok.cpu().nan_to_num(-1.0), tok_ref.nan_to_num(-1.0))
    assert g[0, 3].item() == 1.0 and g[1, 3].isnan() and g[1, 2].isnan()
    _assert_nvfp4_equal(got, dec, ref)


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (2, 0, 1, 3)], ids=["bshd_view", "sbhd_view"])
def test_fp8_rows_read_in_place_from_views(perm):
    """The [B, H, S, D] view of [B, S, H, D] or [S, B, H, D] memory: the bytes of the contiguous call."""
    x = _inputs(128)
    view = x.permute(*perm).contiguous().permute(*[perm.index(i) for i in range(4)])
    assert not view.is_contiguous()
    a, b = quantize_fp8_rows(x), quantize_fp8_rows(view)
    assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) and b.data.is_contiguous()
    assert torch.equal(a.scale.nan_to_num(), b.scale.nan_to_num())


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("blocks", [1, 2, 4])  # blocks of rows per program
def test_fp8_rows_pair_bytes_equal_reference(d, blocks):
    """Q and K in one launch (``quantize_fp8_rows_pair``, GQA heads, K read in place from [B, S, H, D]
    memory, NaN/Inf rows): each the reference's bytes."""
    q = _inputs(d)
    k = _inputs(d, seq=129)[:, :2].transpose(1, 2).contiguous().transpose(1, 2)
    assert not k.is_contiguous()
    k[1, 0, 4, 1] = float("inf")
    q[0, 3, 2, 0] = float("nan")
    for got, x in zip(quantize_fp8_rows_pair(q, k, blocks=blocks), (q, k)):
        ref = quantize_fp8(x.cpu(), "e4m3", dims=(-1,))
        assert torch.equal(got.data.view(torch.uint8).cpu(), ref.data.view(torch.uint8))
        assert torch.equal(got.scale.cpu().nan_to_num(), ref.scale.nan_to_num())
        assert torch.equal(got.scale.cpu().isnan(), ref.scale.isnan())


@triton.jit
def _v_recip_misses_kernel(COUNTS, BLOCK: tl.constexpr):
    """One BF16 amax per program row (bit pattern program_id(0) + 1: every positive finite BF16),
    BLOCK BF16 x patterns per program (program_id(1)): V's codes kernel multiplies x by the exact
    reciprocal of its power-of-two channel scale where the scale is >= ``POW2_RECIP_MIN_SCALE``;
    against ``div_rn`` for every x with |x| <= amax. COUNTS: [pairs checked, FP32 quotients
    differing, E4M3 codes differing]."""
    a = (tl.full([BLOCK], 1, tl.int32) + tl.program_id(0)).to(tl.int16).to(tl.bfloat16, bitcast=True)
    a = a.to(tl.float32)
    xb = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = xb.to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32)
    s = _pow2_ceil(tl.math.div_rn(a, tl.full([BLOCK], 448.0, tl.float32)))
    fast = x * tl.math.div_rn(tl.full([BLOCK], 1.0, tl.float32), s)
    ok = (tl.abs(x) <= a) & (s >= POW2_RECIP_MIN_SCALE)
    exact = tl.math.div_rn(x, s)
    f32 = fast.to(tl.int32, bitcast=True) != exact.to(tl.int32, bitcast=True)
    fast = tl.minimum(tl.maximum(fast, -448.0), 448.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    exact = tl.minimum(tl.maximum(exact, -448.0), 448.0).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    tl.atomic_add(COUNTS, tl.sum(ok.to(tl.int64)))
    tl.atomic_add(COUNTS + 1, tl.sum((ok & f32).to(tl.int64)))
    tl.atomic_add(COUNTS + 2, tl.sum((ok & (fast != exact)).to(tl.int64)))


def test_v_reciprocal_equals_div_rn_on_every_bf16_pair():
    """V's division by the power-of-two channel scale through its exact reciprocal equals
    ``div_rn`` bit for bit on its whole BF16 domain: every BF16 amax whose scale takes that path
    and every BF16 x with |x| <= amax (about 2^30 pairs); the FP32 quotients, hence the codes.
    (A row scale is not a power of two: ``div_rn(1, s)`` then one residual correction missed
    0.18% of the FP32 quotients and 26,784 E4M3 codes on this domain, H200 2026-12-03.)"""
    counts = torch.zeros(3, dtype=torch.int64, device="cuda")
    _v_recip_misses_kernel[(0x7F7F, 65536 // 1024)](counts, BLOCK=1024)
    checked, f32, code = counts.tolist()
    assert checked > 2**29, checked  # not vacuous: most pairs take the path
    assert f32 == 0 and code == 0, (checked, f32, code)


@triton.jit
def _e2m1_misses_kernel(COUNTS, N, BLOCK: tl.constexpr):
    """Every FP32 bit pattern in [0, N) (N = bits(6.0) + 1: every value in [0, 6]): the rounding of
    ``_e2m1_round`` against the seven comparisons of ``_e2m1_code`` and ``_e2m1_value``. COUNTS:
    [values checked, codes differing, values differing]."""
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = b < N
    a = b.to(tl.float32, bitcast=True)
    code, val = _e2m1_round(a)
    want = _e2m1_code(a)
    tl.atomic_add(COUNTS, tl.sum(ok.to(tl.int64)))
    tl.atomic_add(COUNTS + 1, tl.sum((ok & (code != want)).to(tl.int64)))
    tl.atomic_add(COUNTS + 2, tl.sum((ok & (val != _e2m1_value(want))).to(tl.int64)))


def test_e2m1_round_equals_comparisons_on_every_fp32_value():
    """The magic-addend E2M1 rounding of the NVFP4 quantizer equals the comparison rule (round to
    nearest, ties to even) on every FP32 value in [0, 6], about 1.09e9 of them."""
    n = int(torch.tensor(6.0).view(torch.int32)) + 1
    counts = torch.zeros(3, dtype=torch.int64, device="cuda")
    _e2m1_misses_kernel[(triton.cdiv(n, 4096),)](counts, n, BLOCK=4096)
    assert counts.tolist() == [n, 0, 0]


@triton.jit
def _fast_div_misses_kernel(DEN, COUNTS, BLOCK: tl.constexpr):
    """One denominator per program row (``DEN[program_id(0)]``), BLOCK BF16 bit patterns x per
    program (program_id(1)), shaped as ``_block_quotients`` sees a program's blocks; its fast path
    (``fast`` set, as the kernels set it when every denominator is in range) against ``div_rn``,
    over the pairs the kernels send through it (finite x, |x / d| <= 2^32). COUNTS: [pairs checked,
    FP32 quotients differing, of those with |x / d| >= 2^-38, E2M1 codes of min(|q|, 6) differing
    (the kernels take the sign from x)]."""
    R: tl.constexpr = BLOCK // 16
    d = tl.load(DEN + tl.program_id(0) + tl.zeros([R, 1], tl.int32))
    xb = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    x = tl.reshape(xb.to(tl.int16).to(tl.bfloat16, bitcast=True).to(tl.float32), [R, 1, 16])
    finite = tl.abs(x) < float("inf")
    okd = tl.full([R, 1], 1, tl.int1)
    q = _block_quotients(x, d, okd, True)
    want = tl.math.div_rn(x, tl.broadcast_to(d[:, :, None], x.shape))
    bits_differ = q.to(tl.int32, bitcast=True) != want.to(tl.int32, bitcast=True)
    # the kernels take the fast path only with every quotient <= 2^32 (``amax_b``'s bound)
    finite = finite & (tl.abs(want) <= 2.0**32)
    relevant = finite & (tl.abs(want) >= 2.0**-38)
    c, _ = _e2m1_round(tl.minimum(tl.abs(q), 6.0))
    cw, _ = _e2m1_round(tl.minimum(tl.abs(want), 6.0))
    code_differs = c != cw  # the kernels take the sign from x
    tl.atomic_add(COUNTS, tl.sum(finite.to(tl.int64)))
    tl.atomic_add(COUNTS + 1, tl.sum((relevant & bits_differ).to(tl.int64)))
    tl.atomic_add(COUNTS + 2, tl.sum((finite & code_differs).to(tl.int64)))


def test_nvfp4_fast_division_equals_div_rn():
    """The NVFP4 quantizer's per-block reciprocal with ``div_rn``'s own three-FFMA fast path gives
    ``div_rn``'s FP32 quotient for every finite BF16 x whose quotient could matter (2^-38 <= |x / d|
    <= 2^32, the kernels' bound), and the same E2M1 code for every finite BF16 x up to the bound,
    over denominators d from 2^-64 to just under 2^61 (every fourth binade: the mantissas 1, 1.5,
    1.75, the largest, and 60 random ones), about 1.3e8 pairs."""
    g = torch.Generator().manual_seed(0)
    mant = torch.cat([torch.tensor([1.0, 1.5, 1.75, 2.0 - 2.0**-23]), 1.0 + torch.rand(60, generator=g)])
    exps = torch.arange(-64, 61, 4, dtype=torch.float64)
    den = (mant.double()[None, :] * torch.pow(2.0, exps)[:, None]).float().flatten()
    assert float(den.min()) >= 2.0**-64 and float(den.max()) <= 2.0**64
    counts = torch.zeros(3, dtype=torch.int64, device="cuda")
    _fast_div_misses_kernel[(den.numel(), 65536 // 1024)](den.cuda(), counts, BLOCK=1024)
    checked, bits, codes = counts.tolist()
    assert checked > den.numel() * 40000, checked  # of the 65,280 finite BF16 x, most are in range
    assert bits == 0 and codes == 0, (checked, bits, codes)
