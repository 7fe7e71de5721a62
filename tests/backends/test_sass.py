"""Contract §4 case 11: the FP8 recipes' kernels must contain FP8 MMAs (QGMMA on Hopper)."""

import os
import shutil
import subprocess
import tempfile

import pytest
import torch

import fp4_attention as fa

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("needs a Hopper (sm_90) or newer GPU", allow_module_level=True)

from fp4_attention.backends.triton import kernels as triton_kernels  # noqa: E402

from ..conftest import make_qkv  # noqa: E402


def _sass(kernel) -> dict[str, str]:
    """SASS of every compiled specialization of a Triton kernel, by its constexpr key."""
    out = {}
    for dev_cache in kernel.device_caches.values():
        for key, compiled in dev_cache[0].items():
            cubin = compiled.asm["cubin"]
            tool = shutil.which("cuobjdump")
            if tool is None:
                pytest.skip("cuobjdump not found")
            with tempfile.TemporaryDirectory() as tmp:  # one file per call: tests run in parallel (-n)
                path = os.path.join(tmp, "kernel.cubin")
                with open(path, "wb") as f:
                    f.write(cubin)
                out[str(key)] = subprocess.run(
                    [tool, "--dump-sass", path], capture_output=True, text=True, check=True
                ).stdout
    return out


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4qk_fp8pv"])
def test_fp8_recipes_use_qgmma(recipe):
    triton_kernels._fwd_kernel.device_caches.clear()
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 4, 1, 256, 256, 128, device="cuda"))
    fa.attention(q, k, v, recipe=recipe, causal=True, layout="bhsd", backend="triton").sum().backward()
    for kernel in (
        triton_kernels._fwd_kernel,
        triton_kernels._bwd_dkdv_kernel,
        triton_kernels._bwd_dq_kernel,
    ):
        sass = _sass(kernel)
        assert sass, f"{kernel.fn.__name__} was not compiled"
        counts = [(s.count("QGMMA"), s.count("HGMMA")) for s in sass.values()]
        print(f"{kernel.fn.__name__} {recipe}: (QGMMA, HGMMA) instructions per specialization {counts}")
        assert any(qg > 0 for qg, _ in counts), f"{kernel.fn.__name__} ({recipe}) has no QGMMA"
