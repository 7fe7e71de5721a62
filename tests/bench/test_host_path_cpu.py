"""bench/host_path_cpu.py: the launches of one cute training step, counted on the CPU (in a subprocess:
the script sets TRITON_INTERPRET before Triton is imported). The counts pin the step's launches so
that a change that adds one shows here; each launch is host time on the GPU machine (about 15 us
through the launch cache, 46 without it: results/host_overhead_h200)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_launches_of_a_step(tmp_path):
    out = tmp_path / "hp"
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "host_path_cpu.py"), "--steps", "3", "--out", str(out)],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    rows = {r["recipe"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    fp8, nv = rows["fp8"], rows["nvfp4qk_fp8pv"]
    assert fp8["launches"] == {
        "_fp8_rows_pair_kernel": 1,  # Q and K per token, one launch
        "_v_amax_kernel": 1,
        "_fp8_v_t_kernel": 1,
        "FP8ForwardSm90": 1,
        "_head_amax_kernel": 1,  # dO's per-head amax
        "_dout_quant_kernel": 1,
        "_bwd_kv_kernel": 1,
        "FP8BackwardSm90": 1,
        "_bwd_post_kernel": 1,  # dQ, and GQA's dK and dV (FA4's postprocess took three)
    }, fp8["launches"]
    # one fill: the backward's accumulators (V's amax words are zeroed by the Q/K kernel's launch)
    assert fp8["torch_kernels"] == {"zeros": 1}, fp8["torch_kernels"]
    assert fp8["launches_total"] == 10
    # dO's four per-query vectors in one allocation; fp8's V amax words allocated, not filled
    assert fp8["allocations"] == 20 and nv["allocations"] == 25
    assert nv["launches_total"] == 15  # NVFP4 Q, K and V amax words zeroed by one fill
    # every Triton launch of both recipes' steps goes through the launch cache (NVFP4's five did not)
    assert fp8["triton_launches_not_through_launcher"] == nv["triton_launches_not_through_launcher"] == {}
    assert (Path(f"{out}.md")).read_text().startswith("# Host path of the cute backend's step")
