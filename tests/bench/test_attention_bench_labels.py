"""bench/attention_bench.py's compile-time labels: one entry per compiled kernel, the forward's set
options in the label (the k_group and qk_bf16 kernels once shared the plain kernel's label)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from attention_bench import compile_labels  # noqa: E402


def test_each_kernel_has_its_own_label():
    seconds = {
        (128, 4, True, (128, 128, 2), (("k_group", 0), ("qk_bf16", False))): 2.123,
        (128, 4, True, (128, 128, 2), (("k_group", 64), ("qk_bf16", False))): 2.5,
        (128, 4, True, (128, 128, 2), (("qk_bf16", True),)): 3.0,
        ("bwd", 128, 4, False): 3.3,
        ("bwd", 128, 4, False, "qk_bf16"): 3.6,
    }
    assert compile_labels(seconds) == {
        "fwd d128 g4 causal tiles(128, 128, 2)": 2.12,
        "fwd d128 g4 causal tiles(128, 128, 2) k_group=64": 2.5,
        "fwd d128 g4 causal tiles(128, 128, 2) qk_bf16=True": 3.0,
        "bwd d128 g4 non-causal": 3.3,
        "bwd d128 g4 non-causal qk_bf16": 3.6,
    }
