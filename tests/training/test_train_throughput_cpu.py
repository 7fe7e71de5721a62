"""bench/train_throughput.py end to end on CPU: one real ``pretrain_llama.py`` process of the tiny
model (the benchmark's overrides, then the test's shape / corpus overrides; the local-projection
arm, the reference attention backend), parsed into the JSON and markdown outputs. The 8B-shaped
runs themselves need the H200."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import train_throughput as tt


def test_one_cpu_run_end_to_end(tiny_corpus, tmp_path, capsys):
    prefix, cache = tiny_corpus
    out = tmp_path / "out" / "tt"
    code = tt.main(
        [
            "--arms",
            "local-bf16",
            "--backend-override",
            "bf16=reference",
            "--micro-batches",
            "2",
            "--layers",
            "1",
            "--extrapolate-from-layers",
            "0",
            "--warmup",
            "1",
            "--timed",
            "2",
            "--seq",
            "32",
            "--run-dir",
            str(tmp_path / "runs"),
            "--out",
            str(out),
            "--override",
            "model.preset=tiny",
            "model.hidden_size=64",
            "model.ffn_hidden_size=128",
            "model.num_attention_heads=2",
            "model.num_kv_heads=1",
            "model.head_dim=32",
            "model.max_seq_length=64",
            "model.vocab_size=128256",
            f"data.corpus=[{{prefix: {prefix}, weight: 1.0}}]",
            "data.split=90,10,0",
            f"data.cache_dir={cache}",
        ]
    )
    printed = capsys.readouterr().out
    report = json.loads(out.with_suffix(".json").read_text())
    assert code == 0, printed
    [rec] = report["records"]
    assert rec["status"] == "ok" and rec["exit_code"] == 0 and rec["name"] == "local-bf16_mb2_L1"
    run = Path(rec["output_dir"])
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "run_meta.json"]  # no checkpoints
    trains = [
        json.loads(line)
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if '"kind": "train"' in line
    ]
    assert [t["step"] for t in trains] == [1, 2, 3]
    assert rec["median_step_s"] == statistics.median(t["step_time_s"] for t in trains[1:])
    assert rec["tokens_per_s_per_gpu"] == 64 / rec["median_step_s"]
    assert rec["last_loss"] == trains[-1]["loss"] and rec["vs_bf16"] == 1.0
    meta = json.loads((run / "run_meta.json").read_text())
    assert meta["config"]["model"]["num_layers"] == 1 and meta["config"]["checkpoint"]["save"] is False
    assert (
        meta["precision"]["attention_recipe"] == "bf16"
        and meta["config"]["training"]["global_batch_size"] == 2
    )
    assert "checkpoints: disabled" in Path(rec["log"]).read_text()
    assert (
        rec["command"].split()[1].endswith("pretrain_llama.py") and "checkpoint.save=false" in rec["command"]
    )
    assert report["attention_error"] == "skipped: no CUDA device" and report["extrapolation"] == []
    md = out.with_suffix(".md").read_text()
    row = "| local-bf16 | bf16 (local) | bf16 | reference | 2 |"
    assert row in md and report["meta"]["model"]["hidden_size"] == 64
    assert printed.rstrip().splitlines()[-1].startswith(row)
    assert meta["config"]["model"]["transformer_impl"] == "local" and rec["backend"] == "reference"
