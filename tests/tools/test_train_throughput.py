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
from throughput import runner
from throughput.analysis import extrapolate, fit_line, summarize_metrics
from throughput.attention import time_attention
from throughput.plan import BASE_CONFIG, RunSpec, run_overrides
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


def test_overrides_resolve_to_the_intended_8b_shaped_run(tmp_path):
    from training.config import load_config
    from training.plan import make_plan

    ov = run_overrides("nvfp4qk_fp8pv", 4, 12, seq=4096, train_iters=9, output_dir=tmp_path / "r")
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
    assert cfg.attention.recipe == "nvfp4qk_fp8pv" and cfg.attention.backend == "triton"
    assert cfg.projection.precision == "bf16" and cfg.data.corpus == "default" and cfg.data.seq_length == 4096
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
    te = load_config(
        REPO / BASE_CONFIG,
        run_overrides("bf16+te_fp8", 1, 4, seq=4096, train_iters=9, output_dir=tmp_path / "t"),
    )
    assert te.projection.precision == "te_fp8" and te.attention.recipe == "bf16"


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
        "projection": "bf16",
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
        _rec("fp8", 4, 4, 0.48, purpose="extrapolation", fpt=fpt[4]),
        _rec("fp8", 4, 12, 1.22, fpt=fpt[12]),
        _rec("bf16", 2, 12, 0.7, fpt=fpt[12]),
    ]  # another micro-batch: not a point of the line
    ex = {e["arm"]: e for e in extrapolate(recs, dp_efficiency=0.9)}
    bf, f8 = ex["bf16"], ex["fp8"]
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


def _rec(arm, mb, layers, step_s, *, purpose="main", mem=50.0, status="ok", fpt=2e10):
    recipe = arm.split("+")[0]
    r = {
        "name": f"{arm}_mb{mb}_L{layers}",
        "arm": arm,
        "attention_recipe": recipe,
        "projection": "bf16",
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
        "transformer_engine": "TE not installed",
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
        _rec("fp8", 1, 12, 0.28, mem=39.0),
        _rec("nvfp4qk_fp8pv", 1, 12, 0.31, mem=41.0),
        _rec("bf16", 4, 12, 1.00, mem=100.0),
        _rec("fp8", 4, 12, 0.95, mem=98.0),
        _rec("nvfp4qk_fp8pv", 4, 12, 0.0, status="failed"),
    ]
    attention = [
        {"impl": "bf16", "micro_batch": 4, "layout": "sbhd", "fwd_ms": 2.0, "fwd_bwd_ms": 9.0},
        {"impl": "fp8", "micro_batch": 4, "layout": "sbhd", "fwd_ms": 2.5, "fwd_bwd_ms": 14.5},
        {"impl": "cudnn_bf16_sdpa", "micro_batch": 4, "layout": "bhsd", "fwd_ms": 1.0, "fwd_bwd_ms": 4.2},
        {"impl": "nvfp4qk_fp8pv", "micro_batch": 1, "layout": "sbhd", "error": "RuntimeError: boom"},
    ]
    rep = _report(recs, attention)
    by = {r["name"]: r for r in rep["records"]}
    assert by["fp8_mb4_L12"]["attention_share"] == pytest.approx(12 * 14.5e-3 / 0.95)
    assert by["bf16_mb4_L12"]["attention_share"] == pytest.approx(12 * 9e-3 / 1.0)
    assert by["fp8_mb1_L12"]["attention_share"] is None  # no timing at micro-batch 1
    assert by["fp8_mb4_L12"]["tokens_vs_bf16"] == pytest.approx(1.0 / 0.95)
    assert by["fp8_mb1_L12"]["peak_mem_vs_bf16"] == pytest.approx(39 / 40)
    t = {x["target"]: x for x in rep["targets"]}
    assert t["micro-batch 4: fp8 tokens/s/GPU >= 1.03x bf16"]["result"] == "PASS"  # 1.053x
    assert "= 1.053x" in t["micro-batch 4: fp8 tokens/s/GPU >= 1.03x bf16"]["measured"]
    nv = next(x for x in rep["targets"] if x["target"].startswith("micro-batch 4: nvfp4qk_fp8pv"))
    assert nv["result"] == "MISS" and "a run failed" in nv["measured"]
    assert t["peak memory (max allocated) of fp8 <= bf16 at every micro-batch"]["result"] == "PASS"
    assert t["peak memory (max allocated) of nvfp4qk_fp8pv <= bf16 at every micro-batch"]["result"] == "MISS"
    md = to_markdown(rep)
    assert "| fp8 | fp8 | bf16 | 4 | 950.0 | 17,246 |" in md
    assert "| 98.0 | 101.0 | 18.3% | 1.053x | 10.500 | 25 | ok |" in md
    assert "| nvfp4qk_fp8pv | nvfp4qk_fp8pv | bf16 | 4 | - | - | - |" in md and "FAILED: out of memory" in md
    assert "torch.OutOfMemoryError" in md  # the log tail, in the file
    assert "save ~57.6 ms of the 1000.0 ms step" in md  # 12 x (9.0 - 4.2) ms with cuDNN BF16
    assert "error: RuntimeError: boom" in md and "python3 x fp8 4" in md
    term = to_markdown(rep, terminal=True)
    assert "torch.OutOfMemoryError" not in term and "python3 x fp8 4" not in term
    assert (
        term.rstrip().splitlines()[-1].startswith("| nvfp4qk_fp8pv | nvfp4qk_fp8pv | bf16 | 4 |")
    )  # table last
    json.dumps(rep)  # JSON-able


def test_dry_run_prints_validated_commands_and_runs_nothing(tmp_path, capsys):
    run_dir = tmp_path / "runs"
    assert tt.main(["--dry-run", "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    cmds = [line for line in out.splitlines() if line.startswith("[")]
    assert len(cmds) == 12  # 3 arms x micro-batch 1, 2, 4 at 12 layers + 3 at 4 layers (micro-batch 4)
    order = [c.split()[1] for c in cmds]  # the largest micro-batch, then the extrapolation, then the rest
    assert (
        order[:7]
        == [
            "bf16_mb4_L12",
            "fp8_mb4_L12",
            "nvfp4qk_fp8pv_mb4_L12",
            "bf16_mb4_L4",
            "fp8_mb4_L4",
            "nvfp4qk_fp8pv_mb4_L4",
            "bf16_mb2_L12",
        ]
        and order[-1] == "nvfp4qk_fp8pv_mb1_L12"
    )
    assert "Transformer Engine" in out
    for mb in (1, 2, 4):
        for arm in ("bf16", "fp8", "nvfp4qk_fp8pv"):
            line = next(c for c in cmds if f"] {arm}_mb{mb}_L12 (main" in c)
            assert f"attention.recipe={arm} " in line and f"training.micro_batch_size={mb} " in line
            assert "model.num_layers=12 " in line and "checkpoint.save=false" in line
            assert "pretrain_llama.py --config" in line and "training.train_iters=9 " in line
    assert (
        sum(
            "(extrapolation;" in c and "model.num_layers=4 " in c and "micro_batch_size=4 " in c for c in cmds
        )
        == 3
    )
    assert not run_dir.exists()
    assert tt.main(["--dry-run", "--run-dir", str(run_dir), "--override", "model.num_layers=0"]) == 2
    assert "run bf16_mb4_L12: model: num_layers must be a positive integer" in capsys.readouterr().err


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
        backend="reference",
        device="cpu",
        heads=(4, 2, 32),
        timer=timer,
    )
    assert [(r["impl"], r["micro_batch"]) for r in recs] == [
        (i, mb) for mb in (1, 2) for i in ("bf16", "nvfp4qk_fp8pv", "cudnn_bf16_sdpa")
    ]
    for r in recs:
        if r["impl"] == "cudnn_bf16_sdpa":
            assert "error" in r and r["layout"] == "bhsd"
        else:
            assert r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 and r["layout"] == "sbhd" and r["heads"] == "4/2"
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
    meta = metadata(tt.parse_args(["--run-dir", str(tmp_path)]), "TE note")
    assert meta["gpu"] == "NVIDIA H200" and meta["transformer_engine"] == "TE note"


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
    out = tmp_path / "out"
    assert tt.main(["--run-dir", str(tmp_path / "runs"), "--out", str(out), "--no-attention-timing"]) == 1
    assert signal.getsignal(signal.SIGTERM) is previous
    report = json.loads(out.with_suffix(".json").read_text())
    assert calls == ["bf16_mb4_L12", "fp8_mb4_L12"]  # the largest micro-batch first
    recs = report["records"]
    assert len(recs) == 12 and recs[0]["status"] == "ok" and recs[0]["name"] == "bf16_mb4_L12"
    assert all(
        r["failure"].startswith("not completed: the benchmark was stopped (SIGTERM)") for r in recs[1:]
    )
    assert "STOPPED: the benchmark was stopped (SIGTERM)" in out.with_suffix(".md").read_text()
    assert "| bf16 | bf16 | bf16 | 4 | 1000.0 |" in capsys.readouterr().out
