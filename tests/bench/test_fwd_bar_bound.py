"""bench/fwd_bar_bound.py on the committed H200 run of 2026-12-05 (results/session_2026-12-05_h200): the
fewest bytes of the quantization, the arithmetic of the bars, and bad inputs (exit 2)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import fwd_bar_bound as fb  # noqa: E402

RUN = ROOT / "results" / "session_2026-12-05_h200" / "attention_bench_cute_h200.json"


def _run():
    return json.loads(RUN.read_text())


def test_quant_bytes_of_the_training_shape():
    rec = {"B": 4, "Hq": 32, "Hkv": 8, "S": 4096, "D": 128, "causal": True}
    elements = 4 * 4096 * 128 * (32 + 8 + 8)
    assert fb.quant_bytes(rec) == 3 * elements + 4 * (4 * 4096 * 40 + 4 * 8 * 128)
    assert fb.fwd_flops(rec) == 4 * 4 * 32 * 4096**2 * 128 / 2


def test_bound_on_the_committed_run():
    bounds = {b["shape"]: b for b in fb.bound(_run())}
    b4 = bounds["B4 H32/8 S4096 causal"]
    assert b4["ours_kernel_ms"] == pytest.approx(0.855, abs=5e-4)  # the 128x128 kernel-only row
    assert b4["cudnn_fp8_ms"] == pytest.approx(0.672, abs=5e-4)
    assert b4["kernel_speedup_needed"] == pytest.approx(b4["ours_kernel_ms"] / b4["cudnn_fp8_ms"])
    assert b4["with_quant_bar_ms"] == pytest.approx(b4["cudnn_bf16_ms"] / 1.5)
    assert b4["quant_floor_ms"] == pytest.approx(b4["quant_bytes"] / 4.22e9)
    allowed = b4["with_quant_bar_ms"] - b4["quant_floor_ms"] / 0.7
    assert b4["kernel_allowed_with_quant_at_70_ms"] == pytest.approx(allowed)
    assert b4["kernel_tflops_needed"] == pytest.approx(b4["fwd_gflop"] / allowed)  # GFLOP / ms
    # what the run says: every shape needs a kernel faster than cuDNN FP8's for the quantized bar
    assert all(b["vs_cudnn_fp8_needed"] > 1.05 for b in bounds.values())
    assert b4["nvfp4_vs_fa4"] == pytest.approx(0.970 / 0.835, abs=2e-3)


def test_bad_inputs_exit_2(tmp_path, capsys):
    run = _run()
    run["records"] = [r for r in run["records"] if r["impl"] != "cudnn_fp8"]
    (tmp_path / "no_peer.json").write_text(json.dumps(run))
    assert fb.main([str(tmp_path / "no_peer.json")]) == 2
    assert "no forward shape" in capsys.readouterr().err
    assert fb.main([str(tmp_path / "missing.json")]) == 2
    assert fb.main([str(RUN), "--copy-tbs", "0"]) == 2


def test_writes_json_and_markdown(tmp_path):
    assert fb.main([str(RUN), "--out", str(tmp_path / "b")]) == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert len(doc["bounds"]) == 3 and doc["copy_tbs"] == 4.22
    assert "| B4 H32/8 S4096 causal |" in (tmp_path / "b.md").read_text()


def test_the_kernel_and_quantization_bars_do_not_give_the_1_5x_bar():
    """A kernel exactly at cuDNN FP8's time and the quantization exactly at 70% of the copy give
    cuDNN BF16 / (c8 + q70), which in this run is below 1.5 on every shape."""
    for b in fb.bound(_run()):
        assert b["ratio_at_kernel_and_quant_bars"] == pytest.approx(
            b["cudnn_bf16_ms"] / (b["cudnn_fp8_ms"] + b["quant_at_70_ms"])
        )
        assert b["ratio_at_kernel_and_quant_bars"] < 1.5
