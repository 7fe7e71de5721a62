"""metrics.jsonl across launches: a torn last line is removed before the next launch appends, a
resume event supersedes the later steps of the launch before it, and run_meta.json records the
prepared files' digest (data_content)."""

from __future__ import annotations

import json

from training.metrics import _drop_torn_last_line, read_metrics
from training.signals import EXIT_DONE


def test_a_torn_last_line_is_dropped_and_whole_lines_kept(tmp_path):
    path = tmp_path / "m.jsonl"
    assert _drop_torn_last_line(path) == ""  # no file
    path.write_text('{"a": 1}\n{"b": 2}\n')
    assert _drop_torn_last_line(path) == "" and path.read_text() == '{"a": 1}\n{"b": 2}\n'
    path.write_text('{"a": 1}\n{"b": 2}\n{"kind": "train", "st')
    assert _drop_torn_last_line(path) == '{"kind": "train", "st'
    assert path.read_text() == '{"a": 1}\n{"b": 2}\n'
    path.write_text("x" * 100_000)  # one torn line, longer than a read-back chunk
    assert _drop_torn_last_line(path) == "x" * 80 and path.read_text() == ""


def _rec(kind, step, **kw):
    return json.dumps({"kind": kind, "step": step, **kw})


def test_a_resume_event_supersedes_the_later_steps_before_it(tmp_path):
    lines = [_rec("train", s, loss=9.0) for s in (1, 2, 3, 4)] + [_rec("valid", 4, val_loss=9.0)]
    lines += [_rec("event", 2, event="resume"), _rec("train", 3, loss=1.0)]  # a rollback to step 2
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    recs = read_metrics(tmp_path / "m.jsonl")
    assert [(r["kind"], r["step"], r["loss"]) for r in recs] == [
        ("train", 1, 9.0),
        ("train", 2, 9.0),
        ("train", 3, 1.0),
    ]


def test_a_relaunch_after_a_torn_write_appends_whole_lines(make_cfg, train, tmp_path):
    code, log = train(make_cfg())
    assert code == EXIT_DONE, log.text()
    run = tmp_path / "run"
    meta = json.loads((run / "run_meta.json").read_text())
    assert isinstance(meta["data_content"], str) and len(meta["data_content"]) == 32
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 9, "consumed_sam')  # killed in the middle of a write
    code, log = train(make_cfg())  # already done: opens the file, writes its exit event
    assert code == EXIT_DONE, log.text()
    assert f"metrics: WARNING: the last line of {run / 'metrics.jsonl'} was cut mid-write" in log.text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["event"] == "exit" and "already trained 8 of 8 steps" in records[-1]["detail"]
