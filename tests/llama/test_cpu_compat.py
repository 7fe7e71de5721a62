"""llama.cpu_compat: active only without a GPU, and reversible."""

from __future__ import annotations

import pytest
import torch

from llama import cpu_compat


def test_does_nothing_on_a_gpu_machine(mcore):
    if not torch.cuda.is_available():
        pytest.skip("checks the GPU machine's behaviour")
    assert not cpu_compat.needed() and not cpu_compat.installed() and cpu_compat.install() is False


def test_install_uninstall_round_trip(mcore):
    if torch.cuda.is_available():
        pytest.skip("the shim is only for machines without a GPU")
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    assert cpu_compat.installed()  # the package fixture installed it
    cpu_compat.uninstall()
    try:
        assert not cpu_compat.installed()
        with pytest.raises((RuntimeError, AssertionError)):
            torch.cuda.current_device()
        with cpu_compat.patched() as did:
            assert did and torch.cuda.current_device() == "cpu"
            with get_cuda_rng_tracker().fork():  # no-op tracker: no CUDA generator touched
                pass
        assert not cpu_compat.installed()
        with pytest.raises((RuntimeError, AssertionError)):
            torch.cuda.current_device()
    finally:
        cpu_compat.install()


def test_bf16_products_are_fp32_products_rounded_to_bf16(mcore):
    if torch.cuda.is_available():
        pytest.skip("the shim is only for machines without a GPU")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 96, generator=g).bfloat16().requires_grad_()
    b = torch.randn(96, 80, generator=g).bfloat16()
    assert cpu_compat.installed()  # the package fixture installed it
    expected = (a.detach().float() @ b.float()).bfloat16()
    for out in (torch.matmul(a, b), a.matmul(b)):
        assert out.dtype == torch.bfloat16 and torch.equal(out.detach(), expected)
    torch.matmul(a, b).float().sum().backward()  # differentiable, BF16 gradient
    assert a.grad.dtype == torch.bfloat16
    assert torch.equal(a.grad, (torch.ones(64, 80) @ b.float().t()).bfloat16())
    x = torch.randn(8, 8, generator=g)  # other dtypes: torch's own product
    assert torch.equal(torch.matmul(x, x), x @ x)
    cpu_compat.uninstall()
    try:
        native = torch.matmul(a.detach(), b)  # torch's BF16 kernel: FP32 accumulation, other order
        assert (native.float() - expected.float()).abs().max() <= 2**-7 * expected.float().abs().max()
        assert torch.matmul is not cpu_compat._matmul
    finally:
        cpu_compat.install()
