"""The final-validation Welch interval of tools/compare_runs.py (the smallest gap a design resolves),
its Student t quantiles, and arms split by the Q/K rotation; synthetic run directories."""

from __future__ import annotations

import json
import math

import compare_runs
import numpy as np
import pytest
from runcompare import Options, compare
from runcompare.welch import betainc, resolution_factor, t_ppf, welch_interval

FP4 = "nvfp4qk_fp8pv"


# Student t quantiles from printed tables (two-sided 95% and 99%)
@pytest.mark.parametrize(
    "q, df, ref",
    [
        (0.975, 1, 12.7062047),
        (0.975, 2, 4.3026527),
        (0.975, 3, 3.1824463),
        (0.975, 4, 2.7764451),
        (0.975, 10, 2.2281389),
        (0.975, 30, 2.0422725),
        (0.995, 3, 5.8409093),
        (0.95, 5, 2.0150484),
        (0.025, 4, -2.7764451),
    ],
)
def test_t_ppf_matches_tables(q, df, ref):
    assert t_ppf(q, df) == pytest.approx(ref, abs=2e-7)


def test_t_ppf_tends_to_the_normal_and_betainc_edges():
    assert t_ppf(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)
    assert betainc(2.0, 3.0, 0.0) == 0.0 and betainc(2.0, 3.0, 1.0) == 1.0
    # I_x(1, 1) = x; I_x(a, 1) = x^a
    assert betainc(1.0, 1.0, 0.3) == pytest.approx(0.3, abs=1e-12)
    assert betainc(2.5, 1.0, 0.4) == pytest.approx(0.4**2.5, abs=1e-12)
    with pytest.raises(ValueError):
        t_ppf(1.0, 3)


def test_welch_interval_by_hand():
    a = np.array([5.10, 5.20, 5.00])
    b = np.array([5.30, 5.25, 5.40, float("nan")])
    w = welch_interval(a, b, ci=0.95)
    va, vb = a.var(ddof=1), b[:3].var(ddof=1)
    se = math.sqrt(va / 3 + vb / 3)
    df = (va / 3 + vb / 3) ** 2 / ((va / 3) ** 2 / 2 + (vb / 3) ** 2 / 2)
    assert w["n_arm"] == 3 and w["n_base"] == 3 and w["n_excluded"] == 1
    assert w["gap"] == pytest.approx(a.mean() - b[:3].mean())
    assert w["se"] == pytest.approx(se) and w["df"] == pytest.approx(df)
    assert w["half_width"] == pytest.approx(t_ppf(0.975, df) * se)
    assert w["lo"] == pytest.approx(w["gap"] - w["half_width"])
    assert w["indistinguishable"] is False  # -0.217 +- 0.207
    assert "Welch" in w["method"]


def test_welch_needs_two_seeds_and_handles_no_spread():
    one = welch_interval(np.array([5.0]), np.array([5.1, 5.2]))
    assert one["half_width"] is None and one["indistinguishable"] is None and ">= 2 seeds" in one["note"]
    flat = welch_interval(np.array([5.0, 5.0]), np.array([5.0, 5.0]))
    assert flat["half_width"] == 0.0 and flat["indistinguishable"] is True and "spread" in flat["note"]


def test_resolution_factor_in_seed_sd_units():
    # 3 vs 3 seeds: t_{0.975, 4} * sqrt(2/3); 2 vs 2: t_{0.975, 2} * 1
    assert resolution_factor(3, 3) == pytest.approx(2.7764451 * math.sqrt(2 / 3), abs=1e-6)
    assert resolution_factor(2, 2) == pytest.approx(4.3026527, abs=1e-6)
    assert resolution_factor(2, 3) > resolution_factor(3, 3) > resolution_factor(4, 4)
    with pytest.raises(ValueError):
        resolution_factor(1, 3)


def _three_by_three(make_run, gap, seed_offset_sd):
    runs = []
    for s in (0, 1, 2):
        runs.append(make_run(f"bf16_s{s}", seed=s, seed_offset_sd=seed_offset_sd))
        runs.append(make_run(f"fp4_s{s}", recipe=FP4, seed=s, gap=gap, seed_offset_sd=seed_offset_sd))
    return [str(r) for r in runs]


def _last_val(run_dir) -> float:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["kind"] == "valid"][-1]["val_loss"]


def test_compare_reports_the_welch_resolution(make_run, tmp_path):
    runs = _three_by_three(make_run, 0.3, seed_offset_sd=0.02)
    res = compare(runs, Options(n_boot=200, windows=4))
    (c,) = res["comparisons"]
    w = c["valid_final_welch"]
    a = np.array([_last_val(tmp_path / f"fp4_s{s}") for s in range(3)])
    b = np.array([_last_val(tmp_path / f"bf16_s{s}") for s in range(3)])
    ref = welch_interval(a, b)
    assert w["tokens"] == res["grid"]["last_tokens"]
    for k in ("gap", "half_width", "df", "lo", "hi"):
        assert w[k] == pytest.approx(ref[k])
    assert w["indistinguishable"] is False and w["gap"] == pytest.approx(0.3, abs=0.05)

    out = tmp_path / "out"
    assert compare_runs.main([*runs, "--out", str(out), "--no-plots", "--n-boot", "200"]) == 0
    md = (out / "summary.md").read_text()
    assert "## Resolution of the design (final validation loss)" in md
    assert "Welch t interval over seeds" in md and f"{w['half_width']:.4f} nats" in md
    assert "**differs** from the baseline" in md
    saved = json.loads((out / "summary.json").read_text())["comparisons"][0]["valid_final_welch"]
    assert saved["half_width"] == pytest.approx(w["half_width"])


def test_compare_no_gap_is_indistinguishable(make_run, tmp_path):
    runs = _three_by_three(make_run, 0.0, seed_offset_sd=0.02)
    res = compare(runs, Options(n_boot=200, windows=4))
    w = res["comparisons"][0]["valid_final_welch"]
    assert w["indistinguishable"] is True and w["half_width"] > abs(w["gap"])
    out = tmp_path / "out"
    assert compare_runs.main([*runs, "--out", str(out), "--no-plots", "--n-boot", "200"]) == 0
    assert "statistically indistinguishable from the baseline" in (out / "summary.md").read_text()


def test_one_seed_arm_says_no_welch_interval(make_run, tmp_path):
    runs = [make_run("bf16_s0", seed=0), make_run("bf16_s1", seed=1), make_run("fp4", recipe=FP4)]
    runs = [str(r) for r in runs]
    w = compare(runs, Options(n_boot=100, windows=4))["comparisons"][0]["valid_final_welch"]
    assert w["half_width"] is None and "needs >= 2 seeds" in w["note"]


def test_qk_rotation_is_its_own_arm(make_run):
    rot = {"attention": {"recipe": FP4, "qk_rotation": "hadamard"}}
    plain = {"attention": {"recipe": FP4, "qk_rotation": "none"}}
    runs = [
        make_run("bf16", seed=0, config={"attention": {"recipe": "bf16"}}),
        make_run("fp4", recipe=FP4, seed=0, config=plain),
        make_run("fp4_rot", recipe=FP4, seed=0, config=rot),
    ]
    res = compare([str(r) for r in runs], Options(n_boot=100, windows=4))
    assert sorted(res["arms"]) == sorted(
        ["attn=bf16,proj=bf16", f"attn={FP4},proj=bf16", f"attn={FP4}+hadamard,proj=bf16"]
    )
