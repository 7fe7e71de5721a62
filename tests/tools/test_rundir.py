"""tools/rundir.py: the run-directory reader shared by tools/runcompare and tools/multigpu."""

from __future__ import annotations

import json

import pytest
from rundir import meta_value, metrics_lines, parse_meta, read_records


def test_records_in_file_order_and_what_is_not_a_record(tmp_path):
    recs = [
        {"kind": "train", "step": 1, "loss": 2.0},
        {"kind": "event", "step": 1, "event": "resume"},
        {"kind": "train", "step": 1, "loss": 1.5},
    ]
    lines = [json.dumps(recs[0]), "", json.dumps(recs[1]), "[1, 2]", json.dumps(recs[2]), '{"kind": "tr']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    parsed = list(metrics_lines(tmp_path))
    assert [(n, problem) for n, _, problem in parsed] == [
        (1, None),
        (3, None),
        (4, "not a JSON object"),
        (5, None),
        (6, "not valid JSON (Unterminated string starting at)"),
    ]
    assert read_records(tmp_path) == recs  # a repeated step is kept, the torn last line skipped
    assert read_records(tmp_path / "missing") == []
    with pytest.raises(FileNotFoundError):
        list(metrics_lines(tmp_path / "missing"))


def test_run_meta_strict_and_lenient(tmp_path):
    (tmp_path / "run_meta.json").write_text(json.dumps({"seed": 3, "config": {"training": {}}}))
    assert parse_meta(tmp_path)["seed"] == 3
    assert meta_value(tmp_path, lambda m: m["seed"]) == 3
    assert meta_value(tmp_path, lambda m: m["config"]["training"]["train_iters"], "none") == "none"
    assert meta_value(tmp_path / "missing", lambda m: m["seed"]) is None
    (tmp_path / "run_meta.json").write_text("{torn")
    with pytest.raises(ValueError):
        parse_meta(tmp_path)
    assert meta_value(tmp_path, lambda m: m["seed"], 0) == 0
