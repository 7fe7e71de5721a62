"""Bytes saved for backward (counted on the reference, which saves the same payloads as the Triton
backend): bytes saved for backward beyond the output, nvfp4qk_fp8pv <= 40% and fp8 <= 55% of bf16."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from saved_bytes import saved_bytes  # noqa: E402


def test_saved_bytes_ratios():
    base = saved_bytes("bf16", s=512)["beyond_output"]
    assert saved_bytes("fp8", s=512)["beyond_output"] <= 0.55 * base
    assert saved_bytes("nvfp4qk_fp8pv", s=512)["beyond_output"] <= 0.40 * base
