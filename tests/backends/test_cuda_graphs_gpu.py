"""The GPU backends' forward + backward captured in CUDA graphs (as megatron-core's ``--enable-cuda-graph``
and ``bench/attention_bench.py --graphed`` capture them): a replay recomputes from the data in the static
input buffers (no scale or amax baked in on the host), and several graphs kept alive and replayed in
turn each still match the eager step on their own data.

A graph's replay is compared with the eager step on the same inputs: the forward bit for bit, the
gradients within :data:`GRAD_TOL` of relative L2 (the CuTe backward adds dQ's partial sums in the
order its CTAs finish, so two eager runs already differ by a rounding of the BF16 result on some
elements; data left from an earlier replay or another graph would be off by about 1.4).
"""

import pytest
import torch

import fp4_attention as fa
from fp4_attention.backends import get_backend

from ..conftest import make_qkv, rel_l2

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

GRAD_TOL = 4e-3
# (backend, recipe): the low-precision backends of sm_90 and FA4's BF16 control
CASES = [("cute", "fp8"), ("cute", "nvfp4qk_fp8pv"), ("triton", "fp8"), ("fa4", "bf16")]


class Step:
    """Static BF16 ``q [B, Hq, S, D]``, ``k, v [B, Hkv, S, D]`` and ``dout`` on the GPU, and the step
    ``(out, dq, dk, dv) = attention + torch.autograd.grad`` on them, eager or as a CUDA graph."""

    def __init__(self, backend, recipe, shape, causal, seed):
        b, hq, hkv, s, d = shape
        self.backend, self.recipe, self.causal = backend, recipe, causal
        qkv = make_qkv(b, hq, hkv, s, s, d, seed=seed, device="cuda")
        self.q, self.k, self.v = (t.requires_grad_() for t in qkv)
        self.dout = torch.randn_like(self.q)
        self.graph = self.outputs = None

    def __call__(self):
        out = fa.attention(
            self.q,
            self.k,
            self.v,
            recipe=self.recipe,
            causal=self.causal,
            layout="bhsd",
            backend=self.backend,
        )
        return (out, *torch.autograd.grad(out, (self.q, self.k, self.v), self.dout))

    def capture(self, warmup=3):
        """Warm up on a side stream (as ``torch.cuda.graph`` asks), then capture one step."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = self()

    def refill(self, seed):
        """New data in the static inputs (in place: the graph reads these addresses)."""
        g = torch.Generator(device="cuda").manual_seed(seed)
        with torch.no_grad():
            for t in (self.q, self.k, self.v, self.dout):
                t.copy_(torch.randn(t.shape, generator=g, device="cuda", dtype=torch.float32))

    def check_replay(self):
        """Replay, then compare with the eager step on the same inputs."""
        self.graph.replay()
        replayed = [t.clone() for t in self.outputs]
        eager = self()
        torch.cuda.synchronize()
        assert torch.equal(replayed[0], eager[0]), f"{self.backend}/{self.recipe}: output differs"
        for name, got, want in zip(("dq", "dk", "dv"), replayed[1:], eager[1:], strict=True):
            assert torch.isfinite(got).all(), f"{self.backend}/{self.recipe}: {name} not finite"
            err = rel_l2(got, want)
            assert err < GRAD_TOL, f"{self.backend}/{self.recipe}: {name} rel L2 {err:.2e}"


def _importable(backend) -> bool:
    """Whether the backend's kernels import here (``cute`` and ``fa4`` need the ``cute`` extra)."""
    try:
        get_backend(backend)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize(("backend", "recipe"), CASES)
@pytest.mark.parametrize("causal", [True, False])
def test_replay_recomputes_from_new_inputs(backend, recipe, causal):
    if not _importable(backend):
        pytest.skip(f"backend {backend} does not import here (pip install '.[cute]')")
    step = Step(backend, recipe, (2, 8, 2, 512, 128), causal, seed=0)
    step.capture()
    for seed in (1, 2):
        step.refill(seed)
        step.check_replay()


def test_graphs_kept_alive_and_replayed_in_turn():
    """Every case's step captured first (two shapes of cute fp8), then replayed in turn on new data:
    what ``attention_bench --graphed --rounds N`` does, and a model with one graph per layer."""
    steps = []
    for i, (backend, recipe) in enumerate(CASES):
        if _importable(backend):
            steps.append(Step(backend, recipe, (2, 8, 2, 512, 128), True, seed=i))
    if not steps:
        pytest.skip("no GPU backend installed here")
    if _importable("cute"):
        steps.append(Step("cute", "fp8", (1, 4, 4, 1024, 64), False, seed=9))
    for step in steps:
        step.capture()
    for rnd in range(2):
        for i, step in enumerate(steps):
            step.refill(100 * rnd + i)
            step.check_replay()
