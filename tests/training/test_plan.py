"""--dry-run of the 8B configs at world size 64, and impossible combinations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from training.config import load_config
from training.plan import flops_per_token, format_plan, make_plan

REPO = Path(__file__).resolve().parents[2]


def dry_run(config: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "pretrain_llama.py"), "--config", config, "--dry-run", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_8b_plans_at_64_gpus():
    out = {}
    for v in ("bf16", "fp8"):
        res = dry_run(f"configs/llama3_1_8b_100b_{v}.yaml", "--world-size", "64")
        assert res.returncode == 0, res.stderr
        out[v] = res.stdout.splitlines()
        text = res.stdout
        assert (
            "steps                 23,842 (" in text
            and "rounded up: the last step completes the budget" in text
        )
        assert "parameters            8,030,261,248" in text
        assert "accumulation          4 micro-batches" in text
        assert "DP 64, TP 1, PP 1, CP 1" in text and "1024 sequences = 4,194,304 tokens per step" in text
        assert "tokens                100,000,595,968" in text
    diff = [(a, b) for a, b in zip(out["bf16"], out["fp8"]) if a != b]
    assert len(out["bf16"]) == len(out["fp8"])
    assert diff and all(a.startswith("precision") and b.startswith("precision") for a, b in diff)
    assert any("nvfp4qk_fp8pv" in b for _, b in diff) and any("te_fp8" in b for _, b in diff)


def test_plan_numbers():
    cfg = load_config("configs/llama3_1_8b_100b_fp8.yaml")
    plan = make_plan(cfg, 64)
    assert (plan.train_iters, plan.parameters, plan.accumulation, plan.data) == (23842, 8_030_261_248, 4, 64)
    m = cfg.llama()
    assert flops_per_token(m, 4096) == 6 * (8_030_261_248 - 128256 * 4096) + 6 * 32 * 4096 * 4096
    assert make_plan(cfg, 8).accumulation == 32  # fewer GPUs keep the global batch
    assert "precision projection  te_fp8" in format_plan(plan)


@pytest.mark.parametrize(
    "overrides, world, match",
    [
        ([], 48, "global_batch_size=1024 is not divisible by micro_batch_size \\* data_parallel = 4 \\* 48"),
        (["parallel.tensor=3"], 3 * 64, "model.num_attention_heads=32 is not divisible by parallel.tensor=3"),
        (["parallel.tensor=16"], 64, "model.num_kv_heads=8 is not divisible by parallel.tensor=16"),
        (["parallel.pipeline=3"], 3 * 8, "model.num_layers=32 is not divisible by parallel.pipeline=3"),
        (
            ["parallel.context=3"],
            3 * 8,
            "data.seq_length=4096 is not divisible by 2 \\* parallel.context = 6",
        ),
        (["parallel.context=2"], 2 * 8, "does not implement context parallelism"),
        (["parallel.tensor=2"], 63, "world size 63 is not divisible by tensor\\*pipeline\\*context"),
        (
            ["training.micro_batch_size=3", "training.global_batch_size=1023", "data.seq_length=4100"],
            1,
            "needs micro_batch_size \\* seq_length",
        ),
    ],
)
def test_impossible_combinations(overrides, world, match):
    cfg = load_config("configs/llama3_1_8b_100b_fp8.yaml", overrides)
    with pytest.raises(ValueError, match=match):
        make_plan(cfg, world)


def test_dry_run_cli_reports_impossible_plans():
    res = dry_run("configs/llama3_1_8b_100b_bf16.yaml", "--world-size", "48")
    assert res.returncode == 2 and "impossible plan" in res.stderr and "not divisible" in res.stderr
    res = dry_run("configs/llama3_1_8b_100b_bf16.yaml", "training.nope=1")
    assert res.returncode == 2 and "unknown key(s) nope" in res.stderr
