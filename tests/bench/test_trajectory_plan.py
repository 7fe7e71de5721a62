"""bench/trajectory_session.py's plan on CPU: train_iters sized to the device budget from the measured
tokens/s/GPU, the runs per GPU, the deferred run, the refusals, and the --dry-run output."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from trajectory import budget as B  # noqa: E402

from training.config import load_config  # noqa: E402

SCRIPT = REPO / "bench" / "trajectory_session.py"
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def plan8():
    return B.make_plan(gpus=8)


def test_eight_gpus_three_arms_three_seeds(plan8):
    p = plan8
    assert len(p.runs) == 8 and sorted(r.gpu for r in p.runs) == list(range(8))
    assert p.deferred == (("fp8_seed1236", "fp8", 1236),)  # the last arm's last seed waits
    counts = {a: sum(r.arm == a for r in p.runs) for a in ("bf16", "nvfp4qk_fp8pv", "fp8")}
    assert counts == {"bf16": 3, "nvfp4qk_fp8pv": 3, "fp8": 2}
    assert p.tokens >= 200_000_000 and p.tokens == p.train_iters * 65_536
    assert p.val_interval == 153 and p.train_iters % p.val_interval == 0  # ~10M tokens, last at the end
    assert p.device_s <= p.budget.hold_s
    # one more validation interval would not fit: the plan takes all the budget allows
    with pytest.raises(ValueError, match="does not fit the budget"):
        B.make_plan(gpus=8, train_iters=p.train_iters + p.val_interval)
    assert any("2 waves" in n for n in p.notes)


def test_the_arithmetic_by_hand(plan8):
    p, b = plan8, plan8.budget
    tps = p.throughput["nvfp4qk_fp8pv"][0]
    steps = p.train_iters
    by_hand = (
        b.run_start_s
        + steps * 65_536 / tps * (1 + b.margin)
        + math.ceil(steps / 153) * 8 * 65_536 / (3 * tps)
        + math.ceil(steps / 306) * b.save_s
    )
    slow = [r for r in p.runs if r.arm == "nvfp4qk_fp8pv"]
    assert all(r.wall_s == pytest.approx(by_hand) for r in slow)
    assert p.session_s == pytest.approx(b.setup_s + by_hand + b.final_s)
    assert p.device_s == pytest.approx(b.start_s + p.session_s + b.warm_s)
    # the measured numbers: the slowest run's median per arm in the committed comparison
    summary = json.loads((REPO / "results/trajectory/compare/summary.json").read_text())
    medians = [
        r["median_tokens_per_s_per_gpu"] for r in summary["runs"] if r["attention_recipe"] == "nvfp4qk_fp8pv"
    ]
    assert tps == min(medians)


def test_calls_cover_the_session_within_the_device_limits(plan8):
    p, b = plan8, plan8.budget
    assert len(p.calls) == 3
    for i, (start, end) in enumerate(p.calls):
        assert end - start <= b.call_s <= B.DEVICE_CALL_LIMIT_S - 20
        if i:
            assert start - p.calls[i - 1][1] == pytest.approx(b.gap_s) and b.gap_s <= B.DEVICE_WARM_S
    assert p.calls[-1][1] == pytest.approx(p.session_s)
    assert p.stop_at_s + b.final_s + b.start_s + b.warm_s == pytest.approx(b.hold_s)
    assert p.stop_at_s >= b.setup_s + max(p.lane_s.values())


def test_nine_gpus_run_all_nine_and_overrides_pass_the_trainer_config(tmp_path):
    p = B.make_plan(gpus=9, output_root=str(tmp_path))
    assert len(p.runs) == 9 and not p.deferred and not p.notes
    run = next(r for r in p.runs if r.name == "fp8_seed1236")
    blend = [{"prefix": "cache/data/default/kjv_train", "weight": 1020000}, {"prefix": "x/y", "weight": 5}]
    extra = [f"data.corpus={json.dumps(blend)}", "runtime.exit_duration_mins=25.995"]  # as a lane adds them
    cfg = load_config(REPO / p.config, [*run.overrides, *extra])
    assert cfg.attention.recipe == "fp8" and cfg.training.seed == 1236 and cfg.data.seed == 1234
    assert cfg.train_iters == p.train_iters and cfg.validation.interval == 153 and cfg.validation.iters == 8
    assert cfg.logging.telemetry_interval == 40 and cfg.checkpoint.save_interval == 306
    assert cfg.data.corpus[0] == {"prefix": "cache/data/default/kjv_train", "weight": 1020000.0}
    assert cfg.runtime.output_dir == f"{tmp_path}/runs/fp8_seed1236"
    assert cfg.runtime.exit_duration_mins == pytest.approx(25.995)


def test_refusals():
    with pytest.raises(ValueError, match="200,000,000 tokens per run do not fit"):
        B.make_plan(gpus=8, budget=B.Budget(hold_s=900))
    with pytest.raises(ValueError, match="--tokens-per-s nvfp4qk_fp8pv\\+hadamard=N"):
        B.make_plan(gpus=8, arms=("bf16", "nvfp4qk_fp8pv+hadamard"))
    with pytest.raises(ValueError, match="one device call runs at most 600 s"):
        B.make_plan(gpus=8, budget=B.Budget(call_s=590))
    with pytest.raises(ValueError, match="goes back 30 s after a call"):
        B.make_plan(gpus=8, budget=B.Budget(gap_s=45))
    with pytest.raises(ValueError, match="cannot train"):
        B.make_plan(gpus=8, arms=("bf16", "nvfp4"))
    with pytest.raises(ValueError, match="not among the runs"):
        B.make_plan(gpus=1, only=("fp8_seed9",))


def test_rotation_arm_with_a_given_throughput():
    p = B.make_plan(
        gpus=8,
        arms=("bf16", "nvfp4qk_fp8pv+hadamard"),
        seeds=(1, 2, 3, 4),
        tokens_per_s={"nvfp4qk_fp8pv+hadamard": 170_000.0},
    )
    rot = [r for r in p.runs if r.arm == "nvfp4qk_fp8pv+hadamard"]
    assert len(rot) == 4 and all("attention.qk_rotation=hadamard" in r.overrides for r in rot)
    assert p.throughput["nvfp4qk_fp8pv+hadamard"] == (170_000.0, "--tokens-per-s")


def test_deferred_run_later_on_one_gpu(plan8):
    p = B.make_plan(gpus=1, only=("fp8_seed1236",), train_iters=plan8.train_iters)
    assert [r.name for r in p.runs] == ["fp8_seed1236"] and p.train_iters == plan8.train_iters
    assert p.device_s <= p.budget.hold_s


def _cli(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_dry_run_prints_the_plan_and_commands(plan8):
    res = _cli("--dry-run", "--gpus", "8", "/tmp/trajectory")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert f"{plan8.train_iters:,} per run x 65,536 tokens/step = {plan8.tokens:,} tokens per run" in out
    for g in range(8):
        assert f"  GPU {g}  " in out and f"CUDA_VISIBLE_DEVICES={g} " in out
    assert "deferred fp8_seed1236" in out and f"--runs fp8_seed1236 --train-iters {plan8.train_iters}" in out
    assert "device calls    3" in out and f"{plan8.device_s:,.0f} s of 1800 s" in out
    assert "PYTHONUNBUFFERED=1 python3 bench/trajectory_session.py /tmp/trajectory" in out
    # nvfp4qk_fp8pv holds bf16's seeds (paired: t_{0.975, 2} / sqrt(3)); fp8 with one deferred does not
    assert (
        "nvfp4qk_fp8pv - bf16: 3 paired seeds: half-width = 2.48 x the s.d. of the per-seed differences"
        in out
    )
    assert (
        "fp8 - bf16: 2 vs 3 seeds (Welch): half-width = 3.51 x the seed s.d." in out
        and "(nvidia-h200-x8" in out
    )


def test_cli_errors_are_one_line_exit_2():
    for args, text in (
        (("--dry-run", "--hold-s", "900"), "do not fit"),
        (("--dry-run", "--call-s", "700"), "at most 600 s"),
        (("--dry-run", "--tokens-per-s", "fp8=fast"), "ARM=TOKENS_PER_S"),
        (("--dry-run", "--gpus", "0"), "--gpus must be >= 1, got 0"),
        (
            ("--dry-run", "--train-iters", "10"),
            "--train-iters 10 gives 655,360 tokens per run, below --min-tokens",
        ),
    ):
        res = _cli(*args)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert text in res.stderr and "Traceback" not in res.stderr
        if "fp8=fast" not in args:  # (argparse's own errors come with the usage)
            assert len(res.stderr.strip().splitlines()) == 1
