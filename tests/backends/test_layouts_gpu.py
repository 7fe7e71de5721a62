"""The caller's layout costs no copy on the GPU backends (they read and write it in place):
``fa.attention`` on ``[B, S, H, D]`` (FlashAttention's) and ``[S, B, H, D]``
(megatron-core's) tensors gives the output of the ``[B, H, S, D]`` call bit for bit and the same
gradients (up to the order of the backward's FP32 atomic adds), and one training step launches no
torch copy kernel (the quantizers read Q/K in place, the output and the gradients are allocated in
the caller's layout, dO is read in place)."""

import pytest
import torch

import fp4_attention as fa

from ..conftest import have_module, rel_l2

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)


def _require(backend: str) -> None:
    if backend in ("cute", "fa4") and not (have_module("cutlass") and have_module("flash_attn")):
        pytest.skip(f"the {backend} backend needs the cute extra (nvidia-cutlass-dsl, flash-attn-4)")


PERM = {"bshd": (0, 2, 1, 3), "sbhd": (2, 0, 1, 3)}  # [B, H, S, D] -> layout
# (backend, recipe, KV heads of 8 query heads) whose step launches no copy kernel; the Triton
# backward sums GQA dK/dV partials into [B, H, S, D]-contiguous tensors (copied on the way back), so
# it is MHA there
CASES = [("cute", "fp8", 2), ("fa4", "bf16", 2), ("triton", "fp8", 8), ("cute", "nvfp4qk_fp8pv", 8)]
EQUAL_CASES = [(b, r) for b, r, _ in CASES] + [("triton", "nvfp4qk_fp8pv")]


def _step(layout, backend, recipe, q, k, v, dout):
    """One forward + backward in ``layout`` from ``[B, H, S, D]`` data; results back in [B, H, S, D]."""
    inv = lambda t: t.permute(*[PERM[layout].index(i) for i in range(4)]) if layout in PERM else t  # noqa: E731
    fwd = lambda t: t.permute(*PERM[layout]).contiguous() if layout in PERM else t.contiguous()  # noqa: E731
    leaves = [fwd(t).detach().requires_grad_() for t in (q, k, v)]  # fresh leaves (bhsd: not q itself)
    out = fa.attention(*leaves, recipe=recipe, causal=True, layout=layout, backend=backend)
    out.backward(fwd(dout))
    return inv(out.detach()), *(inv(t.grad) for t in leaves), leaves


@pytest.mark.parametrize("backend, recipe", EQUAL_CASES)
@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
@pytest.mark.parametrize("b, hq, hkv, d", [(2, 8, 2, 128), (2, 4, 4, 128), (1, 8, 2, 64)])
def test_layouts_give_the_bhsd_results(backend, recipe, layout, b, hq, hkv, d):
    _require(backend)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, dout = (torch.randn(b, hq, 300, d, device="cuda", generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(b, hkv, 300, d, device="cuda", generator=g).bfloat16() for _ in range(2))
    ref = _step("bhsd", backend, recipe, q, k, v, dout)
    got = _step(layout, backend, recipe, q, k, v, dout)
    assert torch.equal(got[0], ref[0]), "output"
    for name, a, b in zip(("dq", "dk", "dv"), got[1:4], ref[1:4]):
        assert rel_l2(a.float(), b.float()) < 1e-3, name


@pytest.mark.parametrize("backend, recipe, hkv", CASES)
@pytest.mark.parametrize("layout", ["bshd", "sbhd"])
def test_a_training_step_launches_no_copy_kernel(backend, recipe, hkv, layout):
    _require(backend)
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator(device="cuda").manual_seed(0)
    q, dout = (torch.randn(1, 8, 1024, 128, device="cuda", generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(1, hkv, 1024, 128, device="cuda", generator=g).bfloat16() for _ in range(2))
    _step(layout, backend, recipe, q, k, v, dout)  # compile outside the profile
    leaves = [t.permute(*PERM[layout]).contiguous().requires_grad_() for t in (q, k, v)]
    dout_l = dout.permute(*PERM[layout]).contiguous()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fa.attention(*leaves, recipe=recipe, causal=True, layout=layout, backend=backend).backward(dout_l)
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    copies = sorted(n for n in names if "copy" in n.lower())
    assert not copies, copies


@pytest.mark.parametrize("backend, recipe", EQUAL_CASES)
def test_slices_of_a_fused_qkv_buffer(backend, recipe):
    _require(backend)
    """megatron-core's Q/K/V: slices of one [S, B, Hkv, (G + 2) D] projection output (views with
    gaps between tokens), read in place; the same results as contiguous copies of them."""
    s, b, hkv, g, d = 300, 2, 2, 4, 128
    mixed = torch.randn(s, b, hkv, (g + 2) * d, device="cuda").bfloat16()
    q = mixed[..., : g * d].reshape(s, b, hkv * g, d)  # a copy (reshape of a non-contiguous slice)
    k, v = mixed[..., g * d : (g + 1) * d], mixed[..., (g + 1) * d :]  # views with gaps
    dout = torch.randn_like(q)
    outs = []
    for tensors in ((q, k, v), (q.contiguous(), k.contiguous(), v.contiguous())):
        leaves = [t.detach().requires_grad_() for t in tensors]
        out = fa.attention(*leaves, recipe=recipe, causal=True, layout="sbhd", backend=backend)
        out.backward(dout)
        outs.append((out.detach(), *(t.grad for t in leaves)))
    assert torch.equal(outs[0][0], outs[1][0]), "output"
    for name, a, b_ in zip(("dq", "dk", "dv"), outs[0][1:], outs[1][1:]):
        assert rel_l2(a.float(), b_.float()) < 1e-3, name
