"""bench/train_throughput.py on CPU: the run overrides, metrics parsing, failure handling, the
extrapolation, targets and markdown (synthetic metrics.jsonl files), and --dry-run."""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import train_throughput as tt
from throughput import deps, runner
from throughput.analysis import extrapolate, fit_line, summarize_metrics
from throughput.attention import time_attention
from throughput.plan import ALL_ARMS, BASE_CONFIG, RunSpec, run_overrides
from throughput.process import Terminated, failure_reason, on_sigterm, run_process
from throughput.report import build_report, metadata, to_markdown

# megatron-core warns at import about optional packages (TE, Apex, absl)
pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning:megatron"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

TOKENS = 4 * 4096
PEAK = 989.4e12


def write_metrics(
    path: Path, step_times: list[float], *, losses=None, mems=None, extra: list[dict] = ()
) -> Path:
    """A metrics.jsonl as the trainer writes it: start event, one train record per step, exit event."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"kind": "event", "step": 0, "event": "start", "detail": "fresh start"}]
    for i, dt in enumerate(step_times):
        step = i + 1
        lines.append(
            {
                "kind": "train",
                "step": step,
                "consumed_samples": 4 * step,
                "consumed_tokens": TOKENS * step,
                "loss": (losses or [11.0 - 0.1 * i for i in range(len(step_times))])[i],
                "grad_norm": 1.0,
                "lr": 3e-4,
                "step_time_s": dt,
                "tokens_per_s_per_gpu": TOKENS / dt,
                "mfu": 0.4,
                "peak_mem_gib": (mems or [50.0] * len(step_times))[i],
                "skipped": False,
                "nonfinite_count": 0,
            }
        )
    lines += list(extra)
    lines.append({"kind": "event", "step": len(step_times), "event": "exit", "detail": "done"})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def fake_deps(monkeypatch, *, te: bool = True, backends=("fa4", "cute")) -> None:
    """Stand-ins for the child-process import checks: Transformer Engine and the named backends import."""
    te_note = "Transformer Engine 2.6 imports" if te else "Transformer Engine is not installed (test)"
    monkeypatch.setattr(deps, "transformer_engine_status", lambda: (te, te_note))
    monkeypatch.setattr(
        deps,
        "attention_backend_status",
        lambda n: (
            n in backends,
            f"attention backend {n} {'imports' if n in backends else 'is missing (test)'}",
        ),
    )


def test_overrides_resolve_to_the_intended_8b_shaped_run(tmp_path):
    from training.config import load_config
    from training.plan import make_plan

    ov = run_overrides("te-fp8+nvfp4qk_fp8pv", 4, 12, seq=4096, train_iters=9, output_dir=tmp_path / "r")
    cfg = load_config(REPO / BASE_CONFIG, ov)
    m = cfg.llama()
    assert (
        m.num_layers,
        m.hidden_size,
        m.num_attention_heads,
        m.num_kv_heads,
        m.head_dim,
        m.ffn_hidden_size,
        m.vocab_size,
    ) == (12, 4096, 32, 8, 128, 14336, 128256)
    assert cfg.attention.recipe == "nvfp4qk_fp8pv" and cfg.attention.backend == "cute"
    assert cfg.projection.precision == "te_fp8" and m.transformer_impl == "transformer_engine"
    assert cfg.data.corpus == "default" and cfg.data.seq_length == 4096
    assert cfg.training.micro_batch_size == cfg.training.global_batch_size == 4 and cfg.train_iters == 9
    assert (
        cfg.validation.interval == 0 and cfg.logging.telemetry_interval == 0 and not cfg.logging.tensorboard
    )
    assert cfg.logging.log_interval == 1 and cfg.checkpoint.save is False and cfg.checkpoint.load == "none"
    assert cfg.logging.peak_flops_per_gpu == PEAK and cfg.runtime.output_dir == str(tmp_path / "r")
    plan = make_plan(cfg, 1)
    assert plan.accumulation == 1 and plan.data == 1
    assert (
        plan.memory_bytes["total"] / 1e9 < 141
    )  # the plan's estimate (without the CE workspace) fits an H200


def test_te_fp8_arms_train_the_projection_section_of_the_fp8_recipe(tmp_path):
    """Every projection setting of configs/llama3_1_8b_100b_fp8.yaml (its FP8 weight cache included)
    reaches the TE FP8 arms; the BF16 arms keep the BF16 recipe's."""
    from training.config import load_config

    recipe = load_config(REPO / "configs/llama3_1_8b_100b_fp8.yaml").projection
    for arm in ("te-fp8", "te-fp8+fp8-attn", "te-fp8+nvfp4qk_fp8pv"):
        ov = run_overrides(arm, 2, 12, seq=4096, train_iters=9, output_dir=tmp_path / arm)
        assert load_config(REPO / BASE_CONFIG, ov).projection == recipe
    assert recipe.fp8_weight_cache is True
    ov = run_overrides("bf16", 2, 12, seq=4096, train_iters=9, output_dir=tmp_path / "bf16")
    assert not any(o.startswith("projection.fp8") for o in ov)


def test_accumulation_sets_the_global_batch_and_is_checked(tmp_path):
    """--accumulation K: global batch = K x micro-batch, the plan's accumulation must be K (an override
    that changes the global batch behind it is refused), tokens per step count every micro-batch."""
    args = tt.parse_args(
        ["--run-dir", str(tmp_path), "--arms", "te-fp8", "--micro-batches", "2", "--accumulation", "4"]
    )
    specs = tt.plan_runs(args)
    assert {s.accumulation for s in specs} == {4}
    assert all("training.global_batch_size=8" in s.overrides for s in specs)
    tt.validate_runs(specs, args.config)
    assert specs[0].plan["tokens_per_step"] == 8 * 4096
    args.override = ["training.global_batch_size=2"]
    with pytest.raises(ValueError, match="4 micro-batch\\(es\\) per step, got checkpoint.save=False and 1"):
        tt.validate_runs(tt.plan_runs(args), args.config)
    with pytest.raises(SystemExit):
        tt.parse_args(["--accumulation", "0"])
    # each micro-batch of a step runs the attention: its share counts all of them
    from throughput.analysis import derive

    rec = {
        "arm": "bf16",
        "attention": "bf16",
        "micro_batch": 2,
        "accumulation": 4,
        "layers": 12,
        "status": "ok",
        "median_step_s": 1.2,
        "tokens_per_s_per_gpu": 1.0,
        "peak_mem_gib": 1.0,
    }
    derive([rec], [{"impl": "bf16", "micro_batch": 2, "fwd_ms": 0.5, "fwd_bwd_ms": 2.0}])
    assert rec["attention_share"] == pytest.approx(4 * 12 * 2.0 / 1200)
    from throughput.report import _accumulation_text

    assert _accumulation_text({"accumulation": 4}) == "4 x micro-batch (4 micro-batches per step)"
    assert _accumulation_text({}) == _accumulation_text({"accumulation": 1}) == "micro-batch"


# arm -> (model.transformer_impl, attention.recipe, attention.backend, projection.precision)
EXPECTED_ARMS = {
    "bf16": ("transformer_engine", "bf16", "fa4", "bf16"),
    "fp8-attn": ("transformer_engine", "fp8", "cute", "bf16"),
    "te-fp8": ("transformer_engine", "bf16", "fa4", "te_fp8"),
    "te-fp8+fp8-attn": ("transformer_engine", "fp8", "cute", "te_fp8"),
    "te-fp8+nvfp4qk_fp8pv": ("transformer_engine", "nvfp4qk_fp8pv", "cute", "te_fp8"),
    "local-bf16": ("local", "bf16", "fa4", "bf16"),
    "local-bf16+fp8-attn": ("local", "fp8", "cute", "bf16"),
    "local-bf16+nvfp4qk_fp8pv": ("local", "nvfp4qk_fp8pv", "cute", "bf16"),
}
KEYS = ("model.transformer_impl", "attention.recipe", "attention.backend", "projection.precision")


def _keys(overrides: list[str]) -> tuple[str, ...]:
    kv = dict(o.split("=", 1) for o in overrides)
    return tuple(kv[k] for k in KEYS)


def test_arms_order_overrides_and_backend_overrides(tmp_path):
    """The default arms in their order, each arm's projection and attention keys, the opt-in local arms,
    --backend-override, and the baseline always planned."""
    from training.config import load_config

    args = tt.parse_args(["--run-dir", str(tmp_path)])
    assert args.arms == ["bf16", "fp8-attn", "te-fp8", "te-fp8+fp8-attn", "te-fp8+nvfp4qk_fp8pv"]
    assert list(ALL_ARMS) == list(EXPECTED_ARMS)
    for arm, want in EXPECTED_ARMS.items():
        ov = run_overrides(arm, 4, 12, seq=4096, train_iters=9, output_dir=tmp_path / arm)
        assert _keys(ov) == want, arm
        cfg = load_config(REPO / BASE_CONFIG, ov)  # resolves without Transformer Engine installed
        assert (cfg.llama().transformer_impl, cfg.attention.recipe, cfg.attention.backend) == want[:3]
        assert cfg.projection.precision == want[3]
    # --backend-override: every arm of that recipe, the others unchanged
    args = tt.parse_args(["--run-dir", str(tmp_path), "--backend-override", "fp8=triton", "bf16=triton"])
    assert args.backends == {"bf16": "triton", "fp8": "triton", "nvfp4qk_fp8pv": "cute"}
    args = tt.parse_args(
        ["--run-dir", str(tmp_path), "--backend-override", "fp8=triton", "--micro-batches", "4"]
    )
    specs = tt.plan_runs(args)
    got = {s.arm: _keys(s.overrides) for s in specs if s.layers == 12}
    assert got["fp8-attn"][2] == got["te-fp8+fp8-attn"][2] == "triton"
    assert got["bf16"][2] == "fa4" and got["te-fp8+nvfp4qk_fp8pv"][2] == "cute"
    # local arms only: the local baseline is added in front; mixed: bf16 is
    assert tt.parse_args(["--arms", "local-bf16+fp8-attn"]).arms == ["local-bf16", "local-bf16+fp8-attn"]
    assert tt.parse_args(["--arms", "local-bf16+fp8-attn", "te-fp8"]).arms == [
        "bf16",
        "te-fp8",
        "local-bf16+fp8-attn",
    ]
    # the old arm names and a malformed override are usage errors
    for bad in (
        ["--arms", "fp8"],
        ["--arms", "bf16+te_fp8"],
        ["--backend-override", "fp8"],
        ["--backend-override", "fp4=triton"],
    ):
        with pytest.raises(SystemExit) as exc:
            tt.parse_args(bad)
        assert exc.value.code == 2


def test_summarize_metrics_median_of_the_timed_steps(tmp_path):
    times = [9.0, 3.0, 2.0, 1.0, 1.2, 0.9, 1.1, 1.3, 1.05]  # 3 warm-up + 6 timed
    mems = [40.0, 61.5, 60.0, 60.0, 60.0, 60.0, 60.0, 60.0, 60.0]
    # a repeated step: readers keep the LAST record of a step (training/metrics.py)
    stale = {
        "kind": "train",
        "step": 5,
        "consumed_samples": 20,
        "consumed_tokens": 5 * TOKENS,
        "loss": 1.0,
        "grad_norm": 1.0,
        "lr": 3e-4,
        "step_time_s": 99.0,
        "tokens_per_s_per_gpu": 1.0,
        "mfu": 0.4,
        "peak_mem_gib": 99.0,
        "skipped": False,
        "nonfinite_count": 0,
    }
    path = tmp_path / "m.jsonl"
    write_metrics(path, times, mems=mems)
    text = path.read_text().splitlines()
    text.insert(2, json.dumps(stale))  # written before the real step-5 record
    path.write_text("\n".join(text) + "\n")
    s = summarize_metrics(
        path, warmup=3, timed=6, tokens_per_step=TOKENS, flops_per_token=2e10, peak_flops=PEAK
    )
    assert s["step_times_s"] == [1.0, 1.2, 0.9, 1.1, 1.3, 1.05]
    assert s["median_step_s"] == pytest.approx(1.075)
    assert s["tokens_per_s_per_gpu"] == pytest.approx(TOKENS / 1.075)
    assert s["mfu"] == pytest.approx(TOKENS / 1.075 * 2e10 / PEAK)
    assert s["peak_mem_gib"] == 61.5 and s["last_step"] == 9 and s["last_loss"] == pytest.approx(10.2)
    assert s["mfu_trainer_median"] == 0.4 and s["skipped_steps"] == 0
    with pytest.raises(ValueError, match="5 of the 6 timed steps"):
        summarize_metrics(
            write_metrics(tmp_path / "short.jsonl", times[:8]),
            warmup=3,
            timed=6,
            tokens_per_step=TOKENS,
            flops_per_token=2e10,
            peak_flops=PEAK,
        )


def _args(tmp_path, **kw):
    return tt.parse_args(
        [
            "--run-dir",
            str(tmp_path / "runs"),
            "--warmup",
            "1",
            "--timed",
            "2",
            *[x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", str(v))],
        ]
    )


def _spec(tmp_path, argv):
    spec = RunSpec(
        arm="fp8",
        micro_batch=4,
        layers=12,
        purpose="main",
        output_dir=tmp_path / "runs" / "x",
        overrides=[],
        argv=argv,
    )
    spec.plan = {
        "recipe": "fp8",
        "backend": "cute",
        "projection": "bf16",
        "transformer_impl": "transformer_engine",
        "seq_length": 4096,
        "tokens_per_step": TOKENS,
        "train_iters": 3,
        "parameters": 1,
        "flops_per_token": 2e10,
        "peak_flops_per_gpu": PEAK,
        "memory_estimate_gib": 1.0,
    }
    return spec


def test_failed_runs_are_recorded_with_a_reason_and_the_log_tail(tmp_path):
    args = _args(tmp_path)
    oom = [
        sys.executable,
        "-c",
        (
            "import sys; print('step 1 ok'); "
            "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'); "
            "sys.exit(1)"
        ),
    ]
    rec = runner.execute_run(_spec(tmp_path, oom), args, timeout_s=60)
    assert rec["status"] == "failed" and rec["failure"] == "out of memory (exit code 1)"
    assert rec["tokens_per_s_per_gpu"] is None and rec["mfu"] is None and rec["peak_mem_gib"] is None
    assert (rec["arm"], rec["attention"], rec["backend"], rec["projection"]) == ("fp8", "fp8", "cute", "bf16")
    assert "Tried to allocate" in rec["log_tail"] and rec["command"] == shlex.join(oom)
    hang = [sys.executable, "-c", "import time; time.sleep(60)"]
    rec = runner.execute_run(_spec(tmp_path, hang), args, timeout_s=1.0)
    assert rec["status"] == "failed" and rec["timed_out"] and rec["failure"] == "timeout after 1 s"
    assert rec["wall_s"] < 30
    assert failure_reason(-9, False, "Killed", 60) == "killed by SIGKILL (host memory?)"
    assert failure_reason(3, False, "[exit] preempted", 60) == "exit code 3"
    # exit 0 but a non-finite last loss (the child writes the metrics file like the trainer)
    out = tmp_path / "runs" / "x" / "metrics.jsonl"
    lines = [
        json.dumps(
            {
                "kind": "train",
                "step": s,
                "loss": float("nan") if s == 3 else 11.0,
                "grad_norm": None,
                "lr": 1e-4,
                "step_time_s": 0.5,
                "tokens_per_s_per_gpu": 1.0,
                "mfu": None,
                "peak_mem_gib": 1.0,
                "skipped": s == 3,
                "nonfinite_count": int(s == 3),
            }
        )
        for s in (1, 2, 3)
    ]
    nan = [
        sys.executable,
        "-c",
        (
            f"import pathlib; p = pathlib.Path({str(out)!r}); p.parent.mkdir(parents=True); "
            f"p.write_text({chr(10).join(lines)!r})"
        ),
    ]
    rec = runner.execute_run(_spec(tmp_path, nan), args, timeout_s=60)
    assert rec["status"] == "failed" and rec["failure"] == "last loss not finite (nan)"
    assert rec["median_step_s"] == 0.5 and rec["skipped_steps"] == 1


def test_fit_line_and_extrapolation_to_32_layers():
    from llama import preset
    from training.plan import flops_per_token

    a, b = fit_line([(4, 0.5), (12, 1.3)])
    assert (a, b) == (pytest.approx(0.1), pytest.approx(0.1))
    with pytest.raises(ValueError, match="two distinct layer counts"):
        fit_line([(4, 0.5), (4, 0.6)])
    fpt = {n: flops_per_token(preset("llama3_1_8b", num_layers=n), 4096) for n in (4, 12, 32)}
    recs = [
        _rec("bf16", 4, 4, 0.5, purpose="extrapolation", fpt=fpt[4]),
        _rec("bf16", 4, 12, 1.3, fpt=fpt[12]),
        _rec("te-fp8+fp8-attn", 4, 4, 0.48, purpose="extrapolation", fpt=fpt[4]),
        _rec("te-fp8+fp8-attn", 4, 12, 1.22, fpt=fpt[12]),
        _rec("bf16", 2, 12, 0.7, fpt=fpt[12]),
    ]  # another micro-batch: not a point of the line
    ex = {e["arm"]: e for e in extrapolate(recs, dp_efficiency=0.9)}
    bf, f8 = ex["bf16"], ex["te-fp8+fp8-attn"]
    assert bf["points"] == [(4, 0.5), (12, 1.3)] and bf["step_s"] == pytest.approx(3.3)
    assert f8["step_s"] == pytest.approx(0.11 + 0.0925 * 32)
    assert bf["tokens_per_s_1gpu"] == pytest.approx(TOKENS / 3.3)
    assert bf["tokens_per_s_per_gpu_64_est"] == pytest.approx(0.9 * TOKENS / 3.3)
    assert bf["flops_per_token"] == pytest.approx(fpt[32])  # FLOPs per token are linear in the layer count
    assert bf["mfu"] == pytest.approx(TOKENS / 3.3 * fpt[32] / PEAK)
    assert f8["vs_bf16"] == pytest.approx(3.3 / f8["step_s"]) and bf["vs_bf16"] == 1.0
    flat = extrapolate(
        [_rec("bf16", 4, 4, 1.0, purpose="extrapolation"), _rec("bf16", 4, 12, 0.9)], dp_efficiency=0.95
    )
    assert "does not grow with the layer count" in flat[0]["error"]
    # local arms only: their ratios are against local-bf16
    local = extrapolate(
        [
            _rec("local-bf16", 4, 4, 0.5, purpose="extrapolation"),
            _rec("local-bf16", 4, 12, 1.3),
            _rec("local-bf16+fp8-attn", 4, 4, 0.48, purpose="extrapolation"),
            _rec("local-bf16+fp8-attn", 4, 12, 1.22),
        ],
        dp_efficiency=0.9,
    )
    assert [e["vs_bf16"] for e in local] == [1.0, pytest.approx(3.3 / f8["step_s"])]


def _rec(arm, mb, layers, step_s, *, purpose="main", mem=50.0, status="ok", fpt=2e10):
    a = ALL_ARMS[arm]
    r = {
        "name": f"{arm}_mb{mb}_L{layers}",
        "arm": arm,
        "attention": a.recipe,
        "attention_recipe": a.recipe,
        "backend": {"bf16": "fa4"}.get(a.recipe, "cute"),
        "projection": a.projection,
        "transformer_impl": a.transformer_impl,
        "micro_batch": mb,
        "layers": layers,
        "purpose": purpose,
        "seq_length": 4096,
        "tokens_per_step": mb * 4096,
        "flops_per_token": fpt,
        "peak_flops_per_gpu": PEAK,
        "status": status,
        "command": f"python3 x {arm} {mb}",
    }
    if status == "ok":
        tps = mb * 4096 / step_s
        r.update(
            median_step_s=step_s,
            tokens_per_s_per_gpu=tps,
            mfu=tps * fpt / PEAK,
            peak_mem_gib=mem,
            peak_device_mem_gib=mem + 3,
            last_loss=10.5,
            wall_s=25.0,
        )
    else:
        r.update(
            failure="out of memory (exit code 1)",
            log_tail="torch.OutOfMemoryError: CUDA out of memory",
            wall_s=20.0,
            log="runs/x.log",
        )
    return r


def _report(records, attention):
    meta = {
        "layers": 12,
        "gpu": "NVIDIA H200",
        "date": "2026-11-29 12:00 UTC",
        "commit": "abc1234",
        "torch": "2.11",
        "triton": "3.6",
        "megatron_core": "0.19.2",
        "python": "3.12",
        "seq_length": 4096,
        "warmup_steps": 3,
        "timed_steps": 6,
        "dp_efficiency": 0.95,
        "peak_flops_per_gpu": PEAK,
        "peak_note": "H200",
        "flops_per_token_main": 2e10,
        "dependencies": ["Transformer Engine 2.6 imports"],
        "model": {
            "preset": "llama3_1_8b",
            "num_layers": 12,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_kv_heads": 8,
            "head_dim": 128,
            "ffn_hidden_size": 14336,
            "vocab_size": 128256,
        },
    }
    return build_report(meta, records, attention, None, 0.95)


def test_targets_shares_and_markdown():
    recs = [
        _rec("bf16", 1, 12, 0.30, mem=40.0),
        _rec("te-fp8", 1, 12, 0.26, mem=39.0),
        _rec("te-fp8+fp8-attn", 1, 12, 0.22, mem=41.0),
        _rec("bf16", 4, 12, 1.00, mem=100.0),
        _rec("te-fp8", 4, 12, 0.80, mem=98.0),
        _rec("te-fp8+fp8-attn", 4, 12, 0.75, mem=97.0),  # 1.333x bf16, 1.067x te-fp8
        _rec("te-fp8+nvfp4qk_fp8pv", 4, 12, 0.0, status="failed"),
    ]
    attention = [
        {
            "impl": "bf16",
            "backend": "fa4",
            "micro_batch": 4,
            "layout": "sbhd",
            "fwd_ms": 1.0,
            "fwd_bwd_ms": 3.8,
        },
        {
            "impl": "fp8",
            "backend": "cute",
            "micro_batch": 4,
            "layout": "sbhd",
            "fwd_ms": 1.5,
            "fwd_bwd_ms": 5.6,
        },
        {"impl": "cudnn_bf16_sdpa", "micro_batch": 4, "layout": "bhsd", "fwd_ms": 1.0, "fwd_bwd_ms": 4.2},
        {
            "impl": "nvfp4qk_fp8pv",
            "backend": "cute",
            "micro_batch": 1,
            "layout": "sbhd",
            "error": "RuntimeError: boom",
        },
    ]
    rep = _report(recs, attention)
    by = {r["name"]: r for r in rep["records"]}
    assert by["te-fp8+fp8-attn_mb4_L12"]["attention_share"] == pytest.approx(12 * 5.6e-3 / 0.75)
    assert by["te-fp8_mb4_L12"]["attention_share"] == pytest.approx(12 * 3.8e-3 / 0.8)
    assert by["te-fp8+fp8-attn_mb1_L12"]["attention_share"] is None  # no timing at micro-batch 1
    assert by["te-fp8+fp8-attn_mb4_L12"]["vs_bf16"] == pytest.approx(1.0 / 0.75)
    assert by["te-fp8_mb1_L12"]["peak_mem_vs_bf16"] == pytest.approx(39 / 40)
    t = [(x["result"], x["target"], x["measured"]) for x in rep["targets"]]
    assert t == [
        (
            "PASS",
            "micro-batch 4: te-fp8+fp8-attn tokens/s/GPU >= 1.3x bf16",
            "21,845 vs 16,384 = 1.333x",
        ),
        (
            "PASS",
            "micro-batch 4: te-fp8+fp8-attn tokens/s/GPU >= te-fp8's (1.0x)",
            "21,845 vs 20,480 = 1.067x",
        ),
        (
            "PASS",
            "peak memory (max allocated) of te-fp8 <= bf16 at every micro-batch",
            "mb1 39.0 vs 40.0 GiB; mb4 98.0 vs 100.0 GiB",
        ),
        (
            "MISS",
            "peak memory (max allocated) of te-fp8+fp8-attn <= bf16 at every micro-batch",
            "mb1 41.0 vs 40.0 GiB; mb4 97.0 vs 100.0 GiB",
        ),
        (
            "MISS",
            "peak memory (max allocated) of te-fp8+nvfp4qk_fp8pv <= bf16 at every micro-batch",
            "mb4 not measured",
        ),
    ]
    md = to_markdown(rep)
    assert "| te-fp8+fp8-attn | te_fp8 (TE) | fp8 | cute | 4 | 750.0 | 21,845 |" in md
    assert "| 97.0 | 100.0 | 9.0% | 1.333x | 10.500 | 25 | ok |" in md
    assert "| bf16 | bf16 (TE) | bf16 | fa4 | 4 | 1000.0 | 16,384 |" in md and "| 1.000x |" in md
    assert "| te-fp8+nvfp4qk_fp8pv | te_fp8 (TE) | nvfp4qk_fp8pv | cute | 4 | - | - | - |" in md
    assert "FAILED: out of memory" in md and "torch.OutOfMemoryError" in md  # the log tail, in the file
    assert "| fp8 | cute | 4 | sbhd | 1.500 | 5.600 | 67.2 |" in md  # the attention alone, with its backend
    # the FA4 bf16 attention is faster than cuDNN's: no saving claimed
    assert "cuDNN BF16 attention instead of fa4's would cost ~4.8 ms more of the 1000.0 ms step" in md
    assert "error: RuntimeError: boom" in md and "python3 x te-fp8 4" in md
    term = to_markdown(rep, terminal=True)
    assert "torch.OutOfMemoryError" not in term and "python3 x te-fp8 4" not in term
    assert term.rstrip().splitlines()[-1].startswith("| te-fp8+nvfp4qk_fp8pv | te_fp8 (TE) |")  # table last
    json.dumps(rep)  # JSON-able


def test_targets_miss_and_not_measured():
    """A target arm slower than te-fp8 or under 1.3x is a MISS; a failed baseline leaves every ratio
    None and the targets 'not measured'."""
    slow = _report(
        [
            _rec("bf16", 4, 12, 1.00),
            _rec("te-fp8", 4, 12, 0.78),
            _rec("te-fp8+fp8-attn", 4, 12, 0.80),  # 1.25x bf16, slower than te-fp8
        ],
        [],
    )
    assert [x["result"] for x in slow["targets"][:2]] == ["MISS", "MISS"]
    assert slow["targets"][1]["measured"] == "20,480 vs 21,005 = 0.975x"
    failed = _report(
        [
            _rec("bf16", 4, 12, 0.0, status="failed"),
            _rec("te-fp8", 4, 12, 0.80),
            _rec("te-fp8+fp8-attn", 4, 12, 0.75, mem=40.0),
            _rec("bf16", 2, 12, 0.6),  # another micro-batch: its own baseline
            _rec("te-fp8+fp8-attn", 2, 12, 0.5),
        ],
        [],
    )
    by = {r["name"]: r for r in failed["records"]}
    assert by["te-fp8+fp8-attn_mb4_L12"]["vs_bf16"] is None and by["bf16_mb4_L12"]["vs_bf16"] is None
    assert by["te-fp8+fp8-attn_mb4_L12"]["peak_mem_vs_bf16"] is None
    assert by["te-fp8+fp8-attn_mb2_L12"]["vs_bf16"] == pytest.approx(1.2)
    speed, same, *mem = failed["targets"]
    assert speed["result"] == "MISS" and speed["measured"] == "not measured (bf16 failed at micro-batch 4)"
    assert same["result"] == "PASS"  # te-fp8 ran: 0.80 / 0.75
    assert [m["result"] for m in mem] == ["MISS", "MISS"]  # te-fp8 and te-fp8+fp8-attn: mb4 not measured
    md = to_markdown(failed)
    assert (
        "| te-fp8+fp8-attn | te_fp8 (TE) | fp8 | cute | 4 | 750.0 | 21,845 | 44.2% | 40.0 | 43.0 | - | - |"
        in md
    )
    # no micro-batch 4 run at all: the throughput targets are not measured
    small = _report([_rec("bf16", 2, 12, 0.6), _rec("te-fp8+fp8-attn", 2, 12, 0.5)], [])
    assert small["targets"][0]["measured"] == (
        "not measured (te-fp8+fp8-attn not run at micro-batch 4; bf16 not run at micro-batch 4)"
    )


def test_dry_run_prints_the_plan_without_transformer_engine(tmp_path, capsys, monkeypatch):
    """On a machine without Transformer Engine (and without the cute extra) the dry run still validates
    and prints every command, and says that a real run would be refused; nothing runs."""
    fake_deps(monkeypatch, te=False, backends=())
    run_dir = tmp_path / "runs"
    assert tt.main(["--dry-run", "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    cmds = [line for line in out.splitlines() if line.startswith("[")]
    assert len(cmds) == 20  # 5 arms x micro-batch 1, 2, 4 at 12 layers + 5 at 4 layers (micro-batch 4)
    order = [c.split()[1] for c in cmds]  # the largest micro-batch, then the extrapolation, then the rest
    arms = ["bf16", "fp8-attn", "te-fp8", "te-fp8+fp8-attn", "te-fp8+nvfp4qk_fp8pv"]
    assert order == [
        *(f"{a}_mb4_L12" for a in arms),
        *(f"{a}_mb4_L4" for a in arms),
        *(f"{a}_mb2_L12" for a in arms),
        *(f"{a}_mb1_L12" for a in arms),
    ]
    for c in cmds:
        arm = c.split()[1].split("_mb")[0]
        impl, recipe, backend, precision = EXPECTED_ARMS[arm]
        assert f"model.transformer_impl={impl} attention.recipe={recipe} attention.backend={backend} " in c
        assert f"projection.precision={precision} " in c
        assert "pretrain_llama.py --config" in c and "checkpoint.save=false" in c and "train_iters=9 " in c
    assert "Transformer Engine is not installed (test)" in out
    refused = [line for line in out.splitlines() if line.startswith("not runnable here: ")]
    assert (
        len(refused) == 1
        and "install the 'te' extra" in refused[0]
        and "install the 'cute' extra" in refused[0]
    )
    assert not run_dir.exists()
    assert tt.main(["--dry-run", "--run-dir", str(run_dir), "--override", "model.num_layers=0"]) == 2
    assert "run bf16_mb4_L12: model: num_layers must be a positive integer" in capsys.readouterr().err
    # a backend that does not run the recipe is refused with the run's name
    assert tt.main(["--dry-run", "--run-dir", str(run_dir), "--backend-override", "fp8=fa4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train_throughput: run fp8-attn_mb4_L12: ") and "fa4" in err


def test_missing_dependencies_refuse_the_benchmark(tmp_path, capsys, monkeypatch):
    """Without Transformer Engine, or without the cute extra, the arms that need it are refused before
    anything runs: exit 2, one sentence naming what to install and what runs without it."""
    ran = []
    monkeypatch.setattr(runner, "execute_run", lambda spec, args, timeout_s: ran.append(spec.name))
    base = ["--run-dir", str(tmp_path / "runs"), "--no-attention-timing", "--micro-batches", "4"]

    fake_deps(monkeypatch, te=False)
    assert tt.main(base) == 2
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert line == (
        "train_throughput: arm(s) bf16, fp8-attn, te-fp8, te-fp8+fp8-attn, te-fp8+nvfp4qk_fp8pv need "
        "Transformer Engine: Transformer Engine is not installed (test); install the 'te' extra "
        "(pip install -e '.[te]') or run only the local-projection arms (--arms local-bf16 "
        "local-bf16+fp8-attn local-bf16+nvfp4qk_fp8pv)"
    )
    assert "Traceback" not in captured.err and ran == []
    # one TE arm asked for: the baseline needs it too
    assert tt.main([*base, "--arms", "te-fp8"]) == 2
    assert "arm(s) bf16, te-fp8 need Transformer Engine" in capsys.readouterr().err

    fake_deps(monkeypatch, te=True, backends=("fa4",))  # flash-attn-4 but no CUTLASS DSL
    assert tt.main(base) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "train_throughput: arm(s) fp8-attn, te-fp8+fp8-attn, te-fp8+nvfp4qk_fp8pv need attention backend "
        "cute: attention backend cute is missing (test); install the 'cute' extra (pip install -e "
        "'.[cute]') or choose another backend (--backend-override fp8=triton nvfp4qk_fp8pv=triton)"
    )
    assert ran == []

    # the local arms run without Transformer Engine; triton is not checked (base install)
    fake_deps(monkeypatch, te=False, backends=("fa4", "cute"))
    monkeypatch.setattr(runner, "prepare_default_corpus", lambda cache_dir: None)
    local = ["--arms", "local-bf16+fp8-attn", "--extrapolate-from-layers", "0"]
    monkeypatch.setattr(
        runner,
        "execute_run",
        lambda spec, args, timeout_s: (
            ran.append(spec.name) or _rec(spec.arm, spec.micro_batch, spec.layers, 1.0)
        ),
    )
    assert tt.main([*base, *local, "--out", str(tmp_path / "o")]) == 0
    assert ran == ["local-bf16_mb4_L12", "local-bf16+fp8-attn_mb4_L12"]
    report = json.loads((tmp_path / "o.json").read_text())
    assert report["meta"]["baseline"] == "local-bf16"
    assert report["meta"]["dependencies"] == [
        "attention backend fa4 imports",
        "attention backend cute imports",
    ]
    assert [r["vs_bf16"] for r in report["records"]] == [1.0, 1.0]
    capsys.readouterr()
    assert tt.main([*base, *local, "--backend-override", "bf16=triton", "fp8=triton"]) == 0
    assert "attention backend" not in capsys.readouterr().out  # nothing to check: no fa4/cute arm


def test_metrics_from_a_real_cpu_run_are_parsed(tmp_path):
    """Guard against format drift: a record written by training.metrics.MetricsLogger is what we parse."""
    from training.config import load_config
    from training.metrics import MetricsLogger

    cfg = load_config(
        None, ["logging.tensorboard=false", "training.train_iters=3", "training.warmup_iters=1"]
    )
    m = MetricsLogger(tmp_path, cfg=cfg, enabled=True, log=lambda *_: None)
    for step, dt in ((1, 5.0), (2, 1.0), (3, 2.0)):
        m.train(
            step=step,
            consumed_samples=4 * step,
            consumed_tokens=1024 * step,
            loss=math.log(128256) - step,
            grad_norm=1.0,
            lr=1e-3,
            step_time_s=dt,
            tokens_per_s_per_gpu=1024 / dt,
            mfu=None,
            peak_mem_gib=None,
            skipped=False,
            nonfinite_count=0,
        )
    m.close()
    s = summarize_metrics(
        tmp_path / "metrics.jsonl",
        warmup=1,
        timed=2,
        tokens_per_step=1024,
        flops_per_token=1e8,
        peak_flops=PEAK,
    )
    assert s["median_step_s"] == 1.5 and s["peak_mem_gib"] is None and s["mfu_trainer_median"] is None
    assert s["last_loss"] == pytest.approx(math.log(128256) - 3)


def test_attention_timing_plumbing_on_cpu():
    """time_attention with the reference backend and a wall-clock timer: each recipe's forward and
    forward+backward run at [seq, mb, H, D] (sbhd) and fill the gradients; cuDNN cannot run on a CPU
    and is reported as an error, not raised."""
    import time

    filled = []

    def timer(fn, grads):
        for g in grads or ():
            g.grad = None
        t0 = time.perf_counter()
        fn()
        if grads:
            filled.append(all(g.grad is not None and g.grad.shape == g.shape for g in grads))
        return 1e3 * (time.perf_counter() - t0)

    recs = time_attention(
        ["bf16", "nvfp4qk_fp8pv"],
        [1, 2],
        seq=32,
        backend={"bf16": "reference", "nvfp4qk_fp8pv": "reference"},
        device="cpu",
        heads=(4, 2, 32),
        timer=timer,
    )
    assert [(r["impl"], r["micro_batch"]) for r in recs] == [
        (i, mb) for mb in (1, 2) for i in ("bf16", "nvfp4qk_fp8pv", "cudnn_bf16_sdpa")
    ]
    for r in recs:
        if r["impl"] == "cudnn_bf16_sdpa":
            assert "error" in r and r["layout"] == "bhsd" and r["backend"] == "cudnn"
        else:
            assert (
                r["backend"] == "reference"
                and r["fwd_ms"] > 0
                and r["fwd_bwd_ms"] > 0
                and r["layout"] == "sbhd"
                and r["heads"] == "4/2"
            )
    assert filled == [True] * 4


def test_nvidia_smi_readings(tmp_path, monkeypatch):
    """The device-memory poller and the GPU name, with a stand-in nvidia-smi on PATH."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\ncase \"$*\" in *memory.used*) echo 70000 ;; *name*) echo 'NVIDIA H200' ;; esac\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    res = run_process(
        [sys.executable, "-c", "import time; time.sleep(0.5)"], log_path=tmp_path / "x.log", timeout_s=30
    )
    assert res["exit_code"] == 0 and res["peak_device_mem_gib"] == pytest.approx(70000 / 1024)
    meta = metadata(tt.parse_args(["--run-dir", str(tmp_path)]), ["TE note"])
    assert meta["gpu"] == "NVIDIA H200" and meta["dependencies"] == ["TE note"] and meta["baseline"] == "bf16"


def test_sigterm_stops_the_child_and_keeps_what_was_measured(tmp_path, monkeypatch, capsys):
    import signal
    import threading

    # run_process: the benchmark's own SIGTERM (e.g. from `timeout`) takes the running child down with it
    log = tmp_path / "child.log"
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
        with pytest.raises(Terminated):
            run_process(
                [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"],
                log_path=log,
                timeout_s=60,
                poll_memory=False,
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
    with pytest.raises(ProcessLookupError):
        os.kill(int(log.read_text().split()[0]), 0)

    # main: a stop in the middle of the second run writes the first run's numbers and marks the rest
    calls = []

    def fake_run(spec, args, timeout_s):
        calls.append(spec.name)
        if len(calls) == 2:
            raise Terminated("SIGTERM")
        return _rec(spec.arm, spec.micro_batch, spec.layers, 1.0, purpose=spec.purpose)

    monkeypatch.setattr(runner, "execute_run", fake_run)
    monkeypatch.setattr(runner, "prepare_default_corpus", lambda cache_dir: None)
    fake_deps(monkeypatch)
    out = tmp_path / "out"
    assert tt.main(["--run-dir", str(tmp_path / "runs"), "--out", str(out), "--no-attention-timing"]) == 1
    assert signal.getsignal(signal.SIGTERM) is previous
    report = json.loads(out.with_suffix(".json").read_text())
    assert calls == ["bf16_mb4_L12", "fp8-attn_mb4_L12"]  # the largest micro-batch first
    recs = report["records"]
    assert len(recs) == 20 and recs[0]["status"] == "ok" and recs[0]["name"] == "bf16_mb4_L12"
    assert all(
        r["failure"].startswith("not completed: the benchmark was stopped (SIGTERM)") for r in recs[1:]
    )
    assert "STOPPED: the benchmark was stopped (SIGTERM)" in out.with_suffix(".md").read_text()
    assert "| bf16 | bf16 (TE) | bf16 | fa4 | 4 | 1000.0 |" in capsys.readouterr().out
