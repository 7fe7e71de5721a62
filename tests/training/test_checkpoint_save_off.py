"""``checkpoint.save: false``: a run that writes no checkpoint (benchmarks), and must start fresh."""

from __future__ import annotations

import pytest

from training import checkpoint as ckpt
from training.config import load_config
from training.signals import EXIT_CONFIG, EXIT_DONE, EXIT_TIME_BUDGET

from .conftest import metrics


def _events(run_dir):
    return [r for r in metrics(run_dir) if r["kind"] == "event"]


def test_save_false_writes_nothing_and_finishes(make_cfg, train, tmp_path):
    # save_interval 4 in the fixture: with checkpoint.save=true this run would save at steps 4 and 5
    code, log = train(make_cfg("checkpoint.save=false", "training.train_iters=5"))
    assert code == EXIT_DONE, log.text()
    run = tmp_path / "run"
    assert not (run / "checkpoints").exists()
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "run_meta.json"]
    assert "checkpoints: disabled (checkpoint.save=false)" in log.text()
    events = _events(run)
    assert [e["event"] for e in events] == ["start", "exit"]
    assert events[-1]["step"] == 5 and events[-1]["detail"].endswith("nothing saved (checkpoint.save=false)")
    assert max(r["step"] for r in metrics(run) if r["kind"] == "train") == 5


def test_save_false_time_budget_still_exits_with_its_code(make_cfg, train, tmp_path):
    code, log = train(
        make_cfg("checkpoint.save=false", "training.train_iters=400", "runtime.exit_duration_mins=0.001")
    )
    assert code == EXIT_TIME_BUDGET, log.text()
    run = tmp_path / "run"
    assert not (run / "checkpoints").exists()
    last = _events(run)[-1]
    assert last["event"] == "exit" and last["step"] == 1
    assert (
        last["detail"]
        == "time budget runtime.exit_duration_mins reached; nothing saved (checkpoint.save=false)"
    )


def test_save_false_refuses_to_continue_a_saved_run(make_cfg, train, tmp_path):
    code, log = train(make_cfg("training.train_iters=4"))
    assert code == EXIT_DONE, log.text()
    root = tmp_path / "run" / "checkpoints"
    before = sorted(p.name for p in root.iterdir())
    assert before == ["iter_0000004", ckpt.MARKER]
    code, log = train(make_cfg("checkpoint.save=false", "training.train_iters=12"))
    assert code == EXIT_CONFIG
    assert "checkpoint.save=false must start fresh, but checkpoint.load=auto found" in log.text()
    assert "iter_0000004" in log.text() and "checkpoint.load=none" in log.text()
    assert "engine:" not in log.text()  # stopped before the model was built
    # load=none: trains from scratch in the same directory and leaves the checkpoints as they were
    code, log = train(make_cfg("checkpoint.save=false", "checkpoint.load=none", "training.train_iters=3"))
    assert code == EXIT_DONE, log.text()
    assert sorted(p.name for p in root.iterdir()) == before
    assert (root / ckpt.MARKER).read_text().strip() == "4"
    assert _events(tmp_path / "run")[-2]["event"] == "start"


@pytest.mark.parametrize("load", ["/some/checkpoints/iter_0000100", "runs/x/checkpoints"])
def test_save_false_rejects_an_explicit_load_path(load):
    with pytest.raises(ValueError, match="checkpoint.save=false starts a fresh run .* checkpoint.load=none"):
        load_config(None, ["checkpoint.save=false", f"checkpoint.load={load}"])


def test_save_defaults_to_true_and_must_be_a_bool():
    assert load_config(None).checkpoint.save is True
    assert load_config(None, ["checkpoint.save=false", "checkpoint.load=none"]).checkpoint.save is False
    with pytest.raises(ValueError, match="checkpoint.save must be true or false"):
        load_config(None, ["checkpoint.save=no_thanks"])
