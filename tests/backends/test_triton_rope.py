"""RoPE on the GPU (``backends/triton/rope.py``): the kernels' bits against the reference
(``numerics/rope.py``, on the CPU copy of the input, as ``test_triton_quant.py`` does), and
``attention(..., rope=...)`` on the triton and cute backends against the same backend on the RoPE'd
inputs.

The angles reach a few thousand radians (Llama's position x frequency at S 4096), where cos and sin
take every value and a fused multiply-add would round the sum of products differently from the
reference (the kernels are compiled with FP contraction off: ``enable_fp_fusion=False``).
"""

import pytest
import torch

import fp4_attention as fa
from fp4_attention.numerics.quant import nvfp4_global_scale, quantize_fp8, quantize_nvfp4
from fp4_attention.numerics.rope import apply_rope, rope_grad

from ..conftest import have_module

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_rows_pair  # noqa: E402
from fp4_attention.backends.triton.quant_nvfp4 import quantize_nvfp4_heads  # noqa: E402
from fp4_attention.backends.triton.rope import (  # noqa: E402
    quantize_fp8_rows_pair_rope,
    quantize_nvfp4_heads_rope,
    rope_rows,
    rope_rows_pair,
)


def _angles(s: int, d: int, device="cuda") -> torch.Tensor:
    inv = 500000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    return (torch.arange(s, dtype=torch.float32)[:, None] * inv[None, :]).to(device)


def _sbhd(s, b, h, d, seed, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(s, b, h, d, generator=g) * scale).bfloat16().cuda()
    return x.permute(1, 2, 0, 3)  # megatron-core's memory, seen as [B, H, S, D]


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float().cpu(), b.float().cpu()
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))


@pytest.mark.parametrize("d", [64, 128])
def test_rope_rows_equals_the_reference(d):
    s = 4096
    tables = fa.RoPETables.from_angles(_angles(s, d))
    x = _sbhd(s, 2, 3, d, seed=d)
    x[1, 2, 17, 5] = float("nan")
    cpu = (x.cpu(), tables.cos_q.cpu(), tables.sin_q.cpu())
    for heads, rows in ((None, None), (1, 32), (8, 8)):
        y = rope_rows(x, tables.cos_q, tables.sin_q, rows=rows, heads=heads)
        assert _same_values(y, apply_rope(*cpu)), (heads, rows)
        assert y.permute(2, 0, 1, 3).is_contiguous()  # written in the caller's [S, B, H, D] order
        assert _same_values(rope_rows(x, tables.cos_q, tables.sin_q, grad=True), rope_grad(*cpu))
    # two tensors in one launch (dQ and dK of the backward): K contiguous, fewer heads, other positions
    kt = fa.RoPETables.from_angles(_angles(1000, d))
    k = torch.randn(2, 1, 1000, d, device="cuda").bfloat16()
    k_cpu = (k.cpu(), kt.cos_q.cpu(), kt.sin_q.cpu())
    for grad, fn in ((False, apply_rope), (True, rope_grad)):
        yq, yk = rope_rows_pair(x, k, (tables.cos_q, tables.sin_q), (kt.cos_q, kt.sin_q), grad=grad)
        assert _same_values(yq, fn(*cpu)) and _same_values(yk, fn(*k_cpu)), grad


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fused_quantizer_bytes_equal_the_reference(fmt):
    d, sq, sk = 128, 777, 1000  # lengths that are not a multiple of the positions per program
    tq = fa.RoPETables.from_angles(_angles(sk, d)[sk - sq :], _angles(sk, d))
    q = _sbhd(sq, 2, 6, d, seed=1)  # 6 heads: not a multiple of the heads per program
    k = torch.randn(2, 3, sk, d, device="cuda").mul(torch.exp(torch.randn(2, 3, sk, 1, device="cuda")))
    q[0, 5, 3, 1] = float("inf")
    k[1, 0, 9, 0] = float("nan")
    got = quantize_fp8_rows_pair_rope(q, k, (tq.cos_q, tq.sin_q), (tq.cos_k, tq.sin_k), fmt)
    for x, (c, s_), y in ((q, (tq.cos_q, tq.sin_q), got[0]), (k, (tq.cos_k, tq.sin_k), got[1])):
        want = quantize_fp8(apply_rope(x.cpu(), c.cpu(), s_.cpu()), fmt, dims=(-1,))
        assert torch.equal(y.data.view(torch.uint8).cpu(), want.data.view(torch.uint8))
        assert torch.equal(y.scale.cpu().nan_to_num(), want.scale.nan_to_num())
    # and the unfused pair on the kernel's own RoPE gives the same bytes
    plain = quantize_fp8_rows_pair(rope_rows(q, tq.cos_q, tq.sin_q), rope_rows(k, tq.cos_k, tq.sin_k), fmt)
    for a, b in zip(got, plain):
        assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))


@pytest.mark.parametrize("d", [64, 128])
def test_nvfp4_quantizer_with_rope_equals_the_reference(d):
    """``quantize_nvfp4_heads_rope``: payload, block scales, global scale, decode and per-token scale of
    the reference NVFP4 of the RoPE'd tensor (per-head global scale), with a head holding a NaN, one
    an Inf, an all-zero one, two whose global scales take the exact division, 6 heads (not a multiple
    of the heads per program) and a length that is not a multiple of the positions per program; and
    the bytes of the unfused GPU path."""
    s = 1000
    tables = fa.RoPETables.from_angles(_angles(s, d))
    x = _sbhd(s, 2, 6, d, seed=d)
    x[1, 4, 7, 3] = float("nan")
    x[1, 3, 9, 1] = float("-inf")
    x[0, 5] = 0.0
    # global scales far outside the fast division's range (2^-55 .. 2^51): those heads' programs divide
    # with div_rn, a path only the GPU runs (the interpreter always does)
    x[0, 1] *= 2.0**-100
    x[1, 0] *= 2.0**100
    got, dec, tok = quantize_nvfp4_heads_rope(x, tables.cos_q, tables.sin_q)
    y = apply_rope(x.cpu(), tables.cos_q.cpu(), tables.sin_q.cpu())
    ref = quantize_nvfp4(y, nvfp4_global_scale(y, dims=(2, 3)))
    assert torch.equal(got.payload.cpu(), ref.payload) and torch.equal(got.block_scale.cpu(), ref.block_scale)
    assert _same_values(got.global_scale, ref.global_scale)
    assert (
        got.global_scale[0, 5].item() == 1.0
        and got.global_scale[1, 4].isnan()
        and got.global_scale[1, 3].isnan()
    )
    assert got.global_scale[0, 1].item() < 2.0**-90 and got.global_scale[1, 0].item() > 2.0**90
    assert _same_values(dec, ref.scaled_payload().bfloat16())
    assert _same_values(tok, ref.global_scale.reshape(2, 6, 1).expand(2, 6, s))
    plain, plain_dec, plain_tok = quantize_nvfp4_heads(rope_rows(x, tables.cos_q, tables.sin_q))
    assert torch.equal(got.payload, plain.payload) and torch.equal(got.block_scale, plain.block_scale)
    assert _same_values(dec, plain_dec) and _same_values(tok, plain_tok)


def _backends():
    """(backend, recipe) pairs: the fused quantizer (fp8), the RoPE pass before the others (NVFP4, bf16,
    fp8 with the Hadamard rotation or K per 64 keys)."""
    out = [("triton", r) for r in ("fp8", "nvfp4qk_fp8pv", "bf16", "fp8+hadamard", "fp8+k64")]
    # the cute cases where its backend can import: the CUTLASS DSL and flash-attn-4 (bench/cute_session.sh's
    # call B; call A has the DSL's first part, not flash-attn-4)
    if (
        torch.cuda.get_device_capability()[0] == 9
        and have_module("cutlass")
        and have_module("flash_attn.cute")
    ):
        out += [("cute", r) for r in ("fp8", "nvfp4qk_fp8pv", "fp8+k64")]
    return out


def _recipe(name: str):
    from fp4_attention.numerics.recipes import with_k_scale_keys, with_qk_rotation

    if name.endswith("+hadamard"):
        return with_qk_rotation(name.removesuffix("+hadamard"), "hadamard", 3)
    if name.endswith("+k64"):
        return with_k_scale_keys(name.removesuffix("+k64"), 64)
    return name


def _close_per_pair(got: torch.Tensor, want: torch.Tensor) -> None:
    """``got`` within 2^-6 of the larger of its channel pair (i, i + D/2) in ``want``: gradients whose
    accumulation order varies (FP32 atomics) differ by a BF16 step before RoPE's transposed rotation,
    which mixes the pair, so a step of the larger member can land in the smaller one."""
    h = want.shape[-1] // 2
    w = want.float().abs()
    scale = torch.maximum(w[..., :h], w[..., h:]).repeat(*([1] * (w.dim() - 1)), 2)
    err = (got.float() - want.float()).abs()
    assert bool((err <= 2**-6 * scale + 1e-6).all()), (
        f"max error over pair scale {(err / (scale + 1e-6)).max()}"
    )


@pytest.mark.parametrize("backend, recipe", _backends())
@pytest.mark.parametrize("d", [64, 128])
def test_attention_with_rope_equals_attention_of_roped_inputs(backend, recipe, d):
    s, b, hq, hkv = 777, 2, 8, 2
    tables = fa.RoPETables.from_angles(_angles(s, d))
    q, k, v = (_sbhd(s, b, h, d, seed=i).permute(2, 0, 1, 3) for i, h in enumerate((hq, hkv, hkv)))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    kw = dict(recipe=_recipe(recipe), causal=True, layout="sbhd", backend=backend)
    out = fa.attention(q, k, v, rope=tables, **kw)
    qr = rope_rows(q.detach().permute(1, 2, 0, 3), tables.cos_q, tables.sin_q).permute(2, 0, 1, 3)
    kr = rope_rows(k.detach().permute(1, 2, 0, 3), tables.cos_k, tables.sin_k).permute(2, 0, 1, 3)
    qr, kr = qr.requires_grad_(), kr.requires_grad_()
    want = fa.attention(qr, kr, v, **kw)
    assert torch.equal(out, want)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    dqr, dkr, dv_want = torch.autograd.grad(want, (qr, kr, v), dout)
    dq_want = rope_rows(dqr.permute(1, 2, 0, 3), tables.cos_q, tables.sin_q, grad=True).permute(2, 0, 1, 3)
    dk_want = rope_rows(dkr.permute(1, 2, 0, 3), tables.cos_k, tables.sin_k, grad=True).permute(2, 0, 1, 3)
    if getattr(kw["recipe"], "name", kw["recipe"]) in fa.backend_spec(backend).nondeterministic:
        # FP32 atomics (cute's dQ, GQA dK/dV): the same sums in another order
        for a, b_ in ((dq, dq_want), (dk, dk_want)):
            _close_per_pair(a, b_)
        torch.testing.assert_close(dv, dv_want, rtol=2**-7, atol=1e-3)
    else:
        assert torch.equal(dq, dq_want) and torch.equal(dk, dk_want) and torch.equal(dv, dv_want)
