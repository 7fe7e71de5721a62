"""The final-validation t intervals of tools/compare_runs.py (the smallest gap a design resolves):
Welch's, and the paired one where both arms hold the same seeds; their Student t quantiles, and arms
split by the Q/K rotation; synthetic run directories."""

from __future__ import annotations

import json
import math

import compare_runs
import numpy as np
import pytest
from runcompare import Options, compare
from runcompare.welch import betainc, paired_interval, resolution_factor, t_ppf, welch_interval

from tests.tools.conftest import synth_losses

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


def test_paired_interval_by_hand():
    """The per-seed differences d = a - b: mean(d) +- t_{0.975, n-1} s_d / sqrt(n); a seed non-finite
    in either arm drops both of its runs."""
    a = np.array([5.10, 5.20, 5.00, float("nan")])
    b = np.array([5.30, 5.42, 5.19, 5.20])
    w = paired_interval(a, b, ci=0.95)
    d = a[:3] - b[:3]
    assert w["n_arm"] == w["n_base"] == 3 and w["n_excluded"] == 1 and w["df"] == 2.0
    assert w["gap"] == pytest.approx(d.mean()) and w["sd_diff"] == pytest.approx(d.std(ddof=1))
    assert w["half_width"] == pytest.approx(4.3026527 * d.std(ddof=1) / math.sqrt(3), rel=1e-6)
    assert w["indistinguishable"] is False and w["pair_corr"] == pytest.approx(
        np.corrcoef(a[:3], b[:3])[0, 1]
    )
    # the same values unpaired: Welch's interval is over 5x wider (the pairs share the seeds' spread)
    assert welch_interval(a, b)["half_width"] > 5 * w["half_width"]
    assert "paired" in w["method"]
    one = paired_interval(np.array([5.0]), np.array([5.1]))
    assert one["half_width"] is None and ">= 2 seeds" in one["note"]
    same = paired_interval(np.array([5.0, 5.2]), np.array([5.1, 5.3]))
    assert same["half_width"] == 0.0 and "the same" in same["note"] and same["gap"] == pytest.approx(-0.1)
    with pytest.raises(ValueError, match="one per seed"):
        paired_interval(np.array([5.0, 5.1]), np.array([5.0]))


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


def _three_by_three(make_run, gap, seed_offset_sd, arm_seeds=(0, 1, 2)):
    """bf16 seeds 0, 1, 2 and fp4 seeds ``arm_seeds`` (the same: a paired design)."""
    runs = []
    for s, t in zip((0, 1, 2), arm_seeds):
        runs.append(make_run(f"bf16_s{s}", seed=s, seed_offset_sd=seed_offset_sd))
        runs.append(make_run(f"fp4_s{t}", recipe=FP4, seed=t, gap=gap, seed_offset_sd=seed_offset_sd))
    return [str(r) for r in runs]


def _last_val(run_dir) -> float:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["kind"] == "valid"][-1]["val_loss"]


@pytest.mark.parametrize("paired", [True, False])
def test_compare_reports_the_resolution(make_run, tmp_path, paired):
    """Both arms with seeds 0, 1, 2: the paired interval and seeds resampled in pairs; other seeds in
    the arm (3, 4, 5): Welch's interval and seeds resampled per arm."""
    arm_seeds = (0, 1, 2) if paired else (3, 4, 5)
    runs = _three_by_three(make_run, 0.3, seed_offset_sd=0.02, arm_seeds=arm_seeds)
    res = compare(runs, Options(n_boot=200, windows=4))
    (c,) = res["comparisons"]
    assert c["paired"] is paired and c["method"] == ("hier-paired" if paired else "hier")
    w = c["valid_final_seed_interval"]
    a = np.array([_last_val(tmp_path / f"fp4_s{s}") for s in arm_seeds])
    b = np.array([_last_val(tmp_path / f"bf16_s{s}") for s in range(3)])
    ref = (paired_interval if paired else welch_interval)(a, b)
    assert w["tokens"] == res["grid"]["last_tokens"] and w["method"] == ref["method"]
    for k in ("gap", "half_width", "df", "lo", "hi"):
        assert w[k] == pytest.approx(ref[k])
    assert w["indistinguishable"] is False and w["gap"] == pytest.approx(0.3, abs=0.05)
    # the final validation window (one point) gets the same t interval, not a bootstrap of 3 seeds
    vf = c["valid_final"]
    assert vf["method"] == ("t-paired" if paired else "t-welch") and vf["n_points"] == 1
    assert (vf["gap"], vf["lo"], vf["hi"]) == pytest.approx((ref["gap"], ref["lo"], ref["hi"]))
    assert all(
        r["method"] == (vf["method"] if r["n_points"] < 5 else c["method"]) for r in c["valid_windows"]
    )

    out = tmp_path / "out"
    assert compare_runs.main([*runs, "--out", str(out), "--no-plots", "--n-boot", "200"]) == 0
    md = (out / "summary.md").read_text()
    assert f"| {c['method']} (final val: {vf['method']}) |" in md and f"- `{vf['method']}`: " in md
    assert "## Resolution of the design (final validation loss)" in md
    assert w["method"] in md and f"{w['half_width']:.4f} nats" in md
    assert ("| paired t |" if paired else "| Welch t |") in md
    assert "**differs** from the baseline" in md
    saved = json.loads((out / "summary.json").read_text())["comparisons"][0]["valid_final_seed_interval"]
    assert saved["half_width"] == pytest.approx(w["half_width"])


def test_a_paired_design_resolves_what_welch_cannot(make_run, tmp_path):
    """Runs of a seed that share their seed noise (the same loss curve but for the gap and a small
    per-run noise): the paired interval of the final validation gap excludes 0 where Welch's, which
    counts the seeds' spread in each arm, covers it (found in review, 2026-12-06)."""
    runs = []
    for s in (0, 1, 2):
        base = synth_losses(200, gap=0.0, seed=s, seed_offset_sd=0.2)  # a large seed-to-seed spread
        own = np.random.default_rng(s).normal(0, 0.002, 200)
        runs.append(make_run(f"bf16_s{s}", seed=s, losses=base))
        runs.append(make_run(f"fp4_s{s}", recipe=FP4, seed=s, losses=base + 0.01 + own))
    res = compare([str(r) for r in runs], Options(n_boot=200, windows=4))
    w = res["comparisons"][0]["valid_final_seed_interval"]
    assert "paired" in w["method"] and w["indistinguishable"] is False and w["lo"] > 0
    a = np.array([_last_val(tmp_path / f"fp4_s{s}") for s in range(3)])
    b = np.array([_last_val(tmp_path / f"bf16_s{s}") for s in range(3)])
    assert welch_interval(a, b)["indistinguishable"] is True
    assert res["comparisons"][0]["train_final"]["lo"] > 0  # the paired bootstrap too


def test_compare_no_gap_is_indistinguishable(make_run, tmp_path):
    runs = _three_by_three(make_run, 0.0, seed_offset_sd=0.02)
    res = compare(runs, Options(n_boot=200, windows=4))
    w = res["comparisons"][0]["valid_final_seed_interval"]
    assert w["indistinguishable"] is True and w["half_width"] > abs(w["gap"])
    out = tmp_path / "out"
    assert compare_runs.main([*runs, "--out", str(out), "--no-plots", "--n-boot", "200"]) == 0
    assert "statistically indistinguishable from the baseline" in (out / "summary.md").read_text()


def test_one_seed_arm_says_no_welch_interval(make_run, tmp_path):
    runs = [make_run("bf16_s0", seed=0), make_run("bf16_s1", seed=1), make_run("fp4", recipe=FP4)]
    runs = [str(r) for r in runs]
    w = compare(runs, Options(n_boot=100, windows=4))["comparisons"][0]["valid_final_seed_interval"]
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
