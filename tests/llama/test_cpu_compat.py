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
