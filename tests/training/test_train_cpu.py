"""End-to-end CPU runs of the trainer on a tiny model and a tiny real-text corpus (in-process)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from training import checkpoint as ckpt
from training.signals import EXIT_CONFIG, EXIT_DONE, EXIT_NONFINITE

from .conftest import metrics

TRAIN_KEYS = {
    "kind",
    "step",
    "consumed_samples",
    "consumed_tokens",
    "loss",
    "grad_norm",
    "lr",
    "step_time_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "peak_mem_gib",
    "skipped",
    "nonfinite_count",
}


def train_losses(recs):
    """Per step, the last train record's loss (the documented reader rule)."""
    out = {}
    for r in recs:
        if r["kind"] == "train":
            out[r["step"]] = r["loss"]
    return out


def test_short_run_trains_and_writes_documented_outputs(make_cfg, train, tmp_path):
    cfg = make_cfg("training.train_iters=24", "training.warmup_iters=3", "checkpoint.save_interval=8")
    code, log = train(cfg)
    assert code == EXIT_DONE, log.text()
    run = tmp_path / "run"
    recs = metrics(run)
    trains = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in trains] == list(range(1, 25))
    for r in trains:
        assert set(r) == TRAIN_KEYS
        assert r["mfu"] is None and r["skipped"] is False and r["nonfinite_count"] == 0
        assert r["consumed_samples"] == 4 * r["step"] and r["consumed_tokens"] == 128 * r["step"]
    first = sum(r["loss"] for r in trains[:3]) / 3
    last = sum(r["loss"] for r in trains[-3:]) / 3
    assert last < first - 1.0, (first, last)
    valid = [r for r in recs if r["kind"] == "valid"]
    assert [v["step"] for v in valid] == [4, 8, 12, 16, 20, 24] and set(valid[0]) == {
        "kind",
        "step",
        "consumed_tokens",
        "val_loss",
    }
    assert valid[-1]["val_loss"] < valid[0]["val_loss"]
    tele = [r for r in recs if r["kind"] == "telemetry"]
    assert {(t["step"], t["layer"]) for t in tele} == {
        (s, layer) for s in (4, 8, 12, 16, 20, 24) for layer in (1, 2)
    }
    assert all(t["max_logit"] > 0 and t["zero_scale_block_frac"] is None for t in tele)
    events = [(r["event"], r["step"]) for r in recs if r["kind"] == "event"]
    assert events[0] == ("start", 0) and events[-1] == ("exit", 24)
    assert ("save", 8) in events and ("save", 24) in events
    meta = json.loads((run / "run_meta.json").read_text())
    assert set(meta) == {
        "config_fingerprint",
        "data_order_fingerprint",
        "precision",
        "seed",
        "world_size",
        "commit",
        "config",
        "data_content",
        "layer_spec",
    }
    assert meta["layer_spec"] == "local"  # no Transformer Engine on the CPU
    assert (
        meta["precision"]["attention_recipe"] == "fp8"
        and meta["precision"]["attention_backend"] == "reference"
    )
    assert meta["world_size"] == 1 and len(meta["config_fingerprint"]) == 64
    root = run / "checkpoints"
    assert (root / ckpt.MARKER).read_text().strip() == "24"
    assert sorted(p.name for p in root.iterdir()) == [
        "iter_0000016",
        "iter_0000024",
        ckpt.MARKER,
    ]  # keep_last 2
    assert ckpt.verify_checkpoint(ckpt.iter_dir(root, 24)) is None
    assert "backend reference (auto: highest-priority backend for fp8 on CPU)" in log.text()
    assert "torch.optim.AdamW" in log.text()
    # the per-step line: CPU units, elapsed and ETA; the run summary at the end
    step_lines = [line for line in log if line.startswith("step ") and "| loss " in line]
    assert len(step_lines) == 24 and all(" tok/s | " in line and "/GPU" not in line for line in step_lines)
    assert step_lines[0].endswith("ETA -") and step_lines[-1].endswith("| ETA 0:00:00")
    assert all("| elapsed " in line for line in step_lines)
    summary = log.text().split("run summary:\n", 1)[1]
    assert "status       done: 24 of 24 steps" in summary
    assert "24 this launch (steps 1-24); 24 of 24 done" in summary and "3,072 in all" in summary
    assert f"{trains[-1]['loss']:.4f} at step 24; mean " in summary
    assert f"valid loss   {valid[-1]['val_loss']:.4f} at step 24" in summary
    assert " tokens/s (mean of steps 2-24, step time only)" in summary and "MFU" not in summary
    assert f"metrics      {run / 'metrics.jsonl'}" in summary
    assert f"checkpoints  {root} (newest: iter_0000024)" in summary


def test_resume_is_bitwise_exact(make_cfg, train, tmp_path):
    code, log = train(make_cfg(run="full"))
    assert code == EXIT_DONE, log.text()
    full = train_losses(metrics(tmp_path / "full"))
    # "kill" after step 4: a fresh run directory holding only the step-4 checkpoint of the first run
    root = tmp_path / "half" / "checkpoints"
    root.mkdir(parents=True)
    shutil.copytree(ckpt.iter_dir(tmp_path / "full" / "checkpoints", 4), ckpt.iter_dir(root, 4))
    (root / ckpt.MARKER).write_text("4\n")
    code, log = train(make_cfg(run="half"))
    assert code == EXIT_DONE, log.text()
    recs = metrics(tmp_path / "half")
    assert [(r["event"], r["step"]) for r in recs if r["kind"] == "event"][0] == ("resume", 4)
    resumed = train_losses(recs)
    assert sorted(resumed) == [5, 6, 7, 8]
    assert all(resumed[s] == full[s] for s in resumed), (resumed, full)  # bitwise
    a = torch.load(ckpt.iter_dir(tmp_path / "full/checkpoints", 8) / "model.pt", weights_only=True)
    b = torch.load(ckpt.iter_dir(tmp_path / "half/checkpoints", 8) / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_truncated_newest_checkpoint_falls_back(make_cfg, train, tmp_path):
    code, log = train(make_cfg())
    assert code == EXIT_DONE
    root = tmp_path / "run" / "checkpoints"
    opt = ckpt.iter_dir(root, 8) / "optimizer.pt"
    with open(opt, "r+b") as f:
        f.truncate(opt.stat().st_size // 2)
    assert "truncated" in ckpt.verify_checkpoint(ckpt.iter_dir(root, 8))
    code, log = train(make_cfg("training.train_iters=8"))
    assert code == EXIT_DONE, log.text()
    assert (
        "latest checkpoint (iteration 8) is incomplete or damaged; resuming from the previous complete one, "
        "iteration 4" in log.text()
    )
    events = [(r["event"], r["step"]) for r in metrics(tmp_path / "run") if r["kind"] == "event"]
    assert ("resume", 4) in events
    assert ckpt.verify_checkpoint(ckpt.iter_dir(root, 8)) is None  # re-saved complete


def test_changed_model_shape_stops_with_the_difference(make_cfg, train, tmp_path, monkeypatch):
    code, _ = train(make_cfg())
    assert code == EXIT_DONE
    code, log = train(make_cfg("model.num_layers=3", "training.train_iters=12"))
    assert code == EXIT_CONFIG
    text = log.text()
    assert "model.num_layers: 2 in the checkpoint, 3 now" in text
    assert "training.train_iters: 8 in the checkpoint, 12 now" in text and "data.identity" in text
    assert "checkpoint.allow_config_change=[" in text
    # a deliberate change of the run length is allowed explicitly
    code, log = train(
        make_cfg(
            "training.train_iters=10", "checkpoint.allow_config_change=[training.train_iters, data.identity]"
        )
    )
    assert code == EXIT_DONE, log.text()
    assert "allowed config change training.train_iters: 8 -> 10" in log.text()
    # recorded in the resume event, where the comparison tool finds it (found in review, 2026-12-06:
    # run_meta.json is the last launch's, and steps 1-8 compared as if trained under it)
    resume = [r for r in metrics(tmp_path / "run") if r["kind"] == "event" and r["event"] == "resume"][-1]
    assert [c[0] for c in resume["allowed_changes"]] == ["training.train_iters", "data.identity"]
    assert resume["allowed_changes"][0] == ["training.train_iters", 8, 10] and resume["step"] == 8
    assert resume["detail"].endswith("; allowed config changes: training.train_iters, data.identity")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "tools"))
    from runcompare.runs import CompareError, check_config_changes, load_run

    run = load_run(tmp_path / "run")
    assert [(at, [c[0] for c in changes]) for at, changes in run.config_changes] == [
        (8, ["training.train_iters", "data.identity"])
    ]
    with pytest.raises(
        CompareError,
        match=r"run: its steps 1-8 were trained under another config .*"
        r"training.train_iters 8 -> 10, data.identity \"[0-9a-f]+\" -> \"[0-9a-f]+\", allowed at its resume "
        r"from step 8 by checkpoint.allow_config_change\)",
    ):
        check_config_changes([run], force=False)


def test_nonfinite_skip_counts_and_continues(make_cfg, train, tmp_path):
    code, log = train(make_cfg("runtime.nonfinite=skip"), inject_nan_steps=frozenset({3}))
    assert code == EXIT_DONE, log.text()
    trains = {r["step"]: r for r in metrics(tmp_path / "run") if r["kind"] == "train"}
    assert trains[3]["skipped"] and trains[3]["grad_norm"] is None and trains[3]["nonfinite_count"] == 1
    assert all(not trains[s]["skipped"] for s in trains if s != 3)
    assert trains[8]["nonfinite_count"] == 1 and all(trains[s]["loss"] == trains[s]["loss"] for s in (4, 8))
    state = json.loads((tmp_path / "run/checkpoints/iter_0000008/trainer_state.json").read_text())
    assert state["nonfinite_count"] == 1


def test_nonfinite_stop_exits_without_saving(make_cfg, train, tmp_path):
    code, log = train(make_cfg("runtime.nonfinite=stop"), inject_nan_steps=frozenset({6}))
    assert code == EXIT_NONFINITE
    assert "non-finite loss" in log.text() and "runtime.nonfinite=skip" in log.text()
    root = tmp_path / "run" / "checkpoints"
    assert (
        "status       stopped at step 6 of 8: non-finite loss or gradients (runtime.nonfinite=stop), "
        f"nothing saved; a relaunch continues from {ckpt.iter_dir(root, 4)}"
    ) in log.text()
    assert (root / ckpt.MARKER).read_text().strip() == "4"
    assert not ckpt.iter_dir(root, 6).exists() and not ckpt.iter_dir(root, 8).exists()


def _oom_at(monkeypatch, method: str, call: int, error: BaseException | None = None):
    """Make ``CPUEngine.<method>``'s ``call``-th call (1-based) raise ``error``, by default torch's
    out-of-memory error."""
    from training.engine_cpu import CPUEngine

    real, calls = getattr(CPUEngine, method), []

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise error or torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. 1.2 GiB free."
            )
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CPUEngine, method, flaky)


def test_out_of_memory_in_a_step_exits_6_and_names_the_change(make_cfg, train, tmp_path, monkeypatch):
    from training.signals import EXIT_OUT_OF_MEMORY

    _oom_at(monkeypatch, "train_step", 6)
    code, log = train(make_cfg())
    assert code == EXIT_OUT_OF_MEMORY == 6, log.text()
    root = tmp_path / "run" / "checkpoints"
    exit_event = metrics(tmp_path / "run")[-1]
    assert exit_event["kind"] == "event" and exit_event["event"] == "exit" and exit_event["step"] == 5
    detail = exit_event["detail"]
    assert detail.startswith("out of GPU memory in step 6 (CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert "To fit: training.micro_batch_size=1 (estimated " in detail
    assert "checkpoint.allow_config_change=[training.micro_batch_size]" in detail
    assert detail.endswith(f"relaunched with the change, the run resumes from {ckpt.iter_dir(root, 4)}")
    assert (
        "status       stopped after step 5 of 8: out of GPU memory, nothing saved; relaunched with the "
        f"change the exit event names, the job continues from {ckpt.iter_dir(root, 4)}"
    ) in log.text()
    # nothing written after the error; the checkpoint of step 4 is the newest and complete
    assert (root / ckpt.MARKER).read_text().strip() == "4" and not ckpt.iter_dir(root, 6).exists()
    assert ckpt.verify_checkpoint(ckpt.iter_dir(root, 4)) is None
    # out of memory while loading that checkpoint: at start-up, no micro-batch advice, the run's step 4
    monkeypatch.undo()
    _oom_at(monkeypatch, "load", 1)
    code, log = train(make_cfg())
    assert code == EXIT_OUT_OF_MEMORY, log.text()
    event = metrics(tmp_path / "run")[-1]
    assert event["event"] == "exit" and event["step"] == 4
    assert event["detail"].startswith(
        "out of GPU memory at start-up (the model, the optimizer or the checkpoint"
    )
    assert "micro_batch_size" not in event["detail"] and "To fit: raise parallel.tensor" in event["detail"]
    # the change the message names resumes from step 4 and finishes the run
    monkeypatch.undo()
    code, log = train(
        make_cfg("training.micro_batch_size=1", "checkpoint.allow_config_change=[training.micro_batch_size]")
    )
    assert code == EXIT_DONE, log.text()
    assert "allowed config change training.micro_batch_size: 2 -> 1" in log.text()
    trains = [r for r in metrics(tmp_path / "run") if r["kind"] == "train"]
    # the first launch's steps 1-5 (step 5 was not saved), then 5-8 again from the checkpoint of step 4
    assert [r["step"] for r in trains] == [1, 2, 3, 4, 5, 5, 6, 7, 8]


def test_out_of_memory_in_validation_says_where(make_cfg, train, tmp_path, monkeypatch):
    from training.signals import EXIT_OUT_OF_MEMORY

    _oom_at(monkeypatch, "eval_loss", 1)  # the validation after step 4
    code, log = train(make_cfg("checkpoint.save=false"))
    assert code == EXIT_OUT_OF_MEMORY, log.text()
    detail = metrics(tmp_path / "run")[-1]["detail"]
    assert detail.startswith("out of GPU memory in the validation after step 4 (")
    assert detail.endswith(
        f"No complete checkpoint in {tmp_path / 'run' / 'checkpoints'}: a relaunch starts from step 0"
    )


def test_out_of_memory_while_saving_says_so(make_cfg, train, tmp_path, monkeypatch):
    from training.signals import EXIT_OUT_OF_MEMORY

    _oom_at(monkeypatch, "save", 1)  # the checkpoint of step 4
    code, log = train(make_cfg())
    assert code == EXIT_OUT_OF_MEMORY, log.text()
    detail = metrics(tmp_path / "run")[-1]["detail"]
    assert detail.startswith("out of GPU memory while saving the checkpoint of step 4 (")
    assert "micro_batch_size" not in detail
    assert not (tmp_path / "run" / "checkpoints" / ckpt.MARKER).exists()


def test_a_rollback_keeps_its_own_checkpoints_and_a_relaunch_follows_them(make_cfg, train, tmp_path):
    """Found in review (2026-12-06): a run resumed from an older iteration (``checkpoint.load=<path>``)
    while newer ones exist saved a checkpoint at its stop and pruning deleted it at once, keeping the
    newer iterations of the other trajectory; the relaunch then had nothing of its own to resume.
    And a fresh start (``checkpoint.load=none``) into a directory with checkpoints is refused."""
    from training.signals import EXIT_TIME_BUDGET

    code, log = train(make_cfg())  # iterations 4 and 8 (keep_last 2)
    assert code == EXIT_DONE, log.text()
    root = tmp_path / "run" / "checkpoints"
    first = {r["step"]: r["loss"] for r in metrics(tmp_path / "run") if r["kind"] == "train"}
    back = ckpt.iter_dir(root, 4)
    # back to step 4, one step, then the time budget: a stop save of step 5 (keep_last 1)
    stop = ("checkpoint.keep_last=1", "runtime.exit_duration_mins=0.001")
    code, log = train(make_cfg(f"checkpoint.load={back}", *stop))
    assert code == EXIT_TIME_BUDGET, log.text()
    assert (
        f"checkpoint: WARNING: resuming from iteration 4, while {root} also holds iteration(s) 8: they are "
        "kept and not resumed from, and this run's save at one of those iterations replaces it"
    ) in log.text()
    # the other trajectory's 4 and 8 are kept (keep_last counts this run's own: 5)
    assert ckpt.complete_iterations(root) == [4, 5, 8] and (root / ckpt.MARKER).read_text().strip() == "5"
    assert ckpt.verify_checkpoint(ckpt.iter_dir(root, 5)) is None
    # the relaunch (checkpoint.load=auto) follows the marker: step 5's checkpoint, not the other 8
    code, log = train(make_cfg("checkpoint.keep_last=1"))
    assert code == EXIT_DONE, log.text()
    events = [(r["event"], r["step"]) for r in metrics(tmp_path / "run") if r["kind"] == "event"]
    assert [e for e in events if e[0] == "resume"][-1] == ("resume", 5) and events[-1] == ("exit", 8)
    assert ckpt.complete_iterations(root) == [4, 8] and (root / ckpt.MARKER).read_text().strip() == "8"
    again = [r for r in metrics(tmp_path / "run") if r["kind"] == "train"][-3:]
    assert [(r["step"], r["loss"]) for r in again] == [(s, first[s]) for s in (6, 7, 8)]  # same batches
    # a fresh start (checkpoint.load=none) into this checkpoint.dir is refused; nothing is deleted
    before = sorted(p.name for p in root.iterdir())
    code, log = train(make_cfg("checkpoint.load=none"))
    assert code == EXIT_CONFIG, log.text()
    assert (
        f"pretrain_llama: configuration error: checkpoint.load=none starts from scratch, but checkpoint.dir "
        f"{root} holds checkpoints (iteration(s) 4, 8) that this run's saves would be mixed with, replacing "
        "those at the same iterations: to go on from them (a preempted run's relaunch) set "
        "checkpoint.load=auto; to start from scratch use another runtime.output_dir or checkpoint.dir; "
        "nothing was deleted"
    ) in log.text()
    assert sorted(p.name for p in root.iterdir()) == before
    # the finished run's relaunch: its advice names another directory, not checkpoint.load=none
    code, log = train(make_cfg())
    assert code == EXIT_DONE
    assert metrics(tmp_path / "run")[-1]["detail"] == (
        "done: already trained 8 of 8 steps (to train again, use another runtime.output_dir or "
        "checkpoint.dir)"
    )


def test_a_damaged_rollback_checkpoint_falls_back_on_its_own_trajectory(make_cfg, train, tmp_path):
    """Found in review (2026-12-06): after a rollback, the fall-back from a damaged checkpoint took the
    newest older iteration, which could be the rolled-back run's (here A's 8 between the rollback's 6
    and 9). Now it keeps to the failed checkpoint's trajectory and says which it skipped."""
    code, log = train(make_cfg("training.train_iters=10", "checkpoint.keep_last=5"))  # A: 4, 8, 10
    assert code == EXIT_DONE, log.text()
    root = tmp_path / "run" / "checkpoints"
    back = ckpt.iter_dir(root, 4)
    b = ("training.train_iters=10", "checkpoint.save_interval=3", "checkpoint.keep_last=5")
    code, log = train(make_cfg(f"checkpoint.load={back}", *b))  # B from A's 4: 6, 9, 10 (replaces A's)
    assert code == EXIT_DONE, log.text()
    assert ckpt.complete_iterations(root) == [4, 6, 8, 9, 10]
    losses_b = {r["step"]: r["loss"] for r in metrics(tmp_path / "run") if r["kind"] == "train"}

    def damage(*its):  # one bit each
        for it in its:
            f = ckpt.iter_dir(root, it) / "model.pt"
            data = bytearray(f.read_bytes())
            data[len(data) // 2] ^= 1
            f.write_bytes(bytes(data))

    damage(9, 10)  # B's newest two
    code, log = train(make_cfg(*b))  # the relaunch with checkpoint.load=auto
    assert code == EXIT_DONE, log.text()
    assert (
        "checkpoint: WARNING: skipping iteration 8: a checkpoint of another trajectory than iter_0000010's "
        "(started from scratch, or saved before origins were recorded); to resume that trajectory instead, "
        f"name it: checkpoint.load={ckpt.iter_dir(root, 8)}"
    ) in log.text()
    events = [(r["event"], r["step"]) for r in metrics(tmp_path / "run") if r["kind"] == "event"]
    assert [e for e in events if e[0] == "resume"][-1] == ("resume", 6)
    again = [r for r in metrics(tmp_path / "run") if r["kind"] == "train"][-4:]
    assert [(r["step"], r["loss"]) for r in again] == [(s, losses_b[s]) for s in (7, 8, 9, 10)]
    # all of B's own damaged: back to its start, A's 4, and on as B (review of 2026-12-06: the saves
    # took A's identity, from scratch, and A's 8 would have counted as theirs)
    damage(6, 9, 10)
    code, log = train(make_cfg(*b))
    assert code == EXIT_DONE, log.text()
    events = [(r["event"], r["step"]) for r in metrics(tmp_path / "run") if r["kind"] == "event"]
    assert [e for e in events if e[0] == "resume"][-1] == ("resume", 4)
    again = [r for r in metrics(tmp_path / "run") if r["kind"] == "train"][-6:]
    assert [(r["step"], r["loss"]) for r in again] == [(s, losses_b[s]) for s in range(5, 11)]
    assert [ckpt.origin_of(ckpt.iter_dir(root, it)) for it in (6, 9, 10)] == [str(back.resolve())] * 3
    assert ckpt.origin_of(ckpt.iter_dir(root, 8)) is None  # A's, kept


def test_a_damaged_marker_after_a_rollback_goes_on_with_the_rollback(make_cfg, train, tmp_path):
    """Found in review (2026-12-06): after a rollback that stopped before the rolled-back run's last
    iteration, a damaged marker made the relaunch take the newest directory, the rolled-back run's,
    and end at once as "already trained". The checkpoint saved last is what the marker named: the
    relaunch goes on with it."""
    from training.signals import EXIT_TIME_BUDGET

    code, log = train(make_cfg("checkpoint.keep_last=3"))  # A: 4 and 8
    assert code == EXIT_DONE, log.text()
    root = tmp_path / "run" / "checkpoints"
    first = {r["step"]: r["loss"] for r in metrics(tmp_path / "run") if r["kind"] == "train"}
    back = ckpt.iter_dir(root, 4)
    code, log = train(make_cfg(f"checkpoint.load={back}", "runtime.exit_duration_mins=0.001"))
    assert code == EXIT_TIME_BUDGET, log.text()  # B from A's 4: one step, its stop save at 5
    assert ckpt.complete_iterations(root) == [4, 5, 8]
    (root / ckpt.MARKER).write_bytes(b"\x00\x17garbage")
    code, log = train(make_cfg())  # the relaunch: checkpoint.load=auto
    assert code == EXIT_DONE, log.text()
    assert (
        f"checkpoint: WARNING: no marker names the checkpoint to resume; the one saved last into {root} is "
        "iteration 5 (save 3), and iteration(s) 8 (save 2) above it were saved before it, by a run rolled "
        "back since: resuming from 5"
    ) in log.text()
    events = [(r["event"], r["step"]) for r in metrics(tmp_path / "run") if r["kind"] == "event"]
    assert [e for e in events if e[0] == "resume"][-1] == ("resume", 5) and events[-1] == ("exit", 8)
    again = [r for r in metrics(tmp_path / "run") if r["kind"] == "train"][-3:]
    assert [(r["step"], r["loss"]) for r in again] == [(s, first[s]) for s in (6, 7, 8)]  # same batches
    assert ckpt.origin_of(ckpt.iter_dir(root, 8)) == str(back.resolve())  # B's save replaced A's 8


def test_a_damaged_marker_after_a_rollback_by_marker_and_back_goes_on_with_the_last_save(
    make_cfg, train, tmp_path
):
    """From the review of the first fix (2026-12-06), which took the run started from another's
    checkpoint as the newer: B from A's 4 (saved 5), then the marker edited back to A's 8 and A on to
    12 (saved again). With the marker damaged, the relaunch resumed B's 5 and its saves replaced A's
    8 and 12. A's 12 is the last save: the relaunch finds the run done."""
    from training.signals import EXIT_TIME_BUDGET

    run = ("training.train_iters=12", "checkpoint.keep_last=5")
    code, log = train(make_cfg(*run))  # A: 4, 8, 12
    assert code == EXIT_DONE, log.text()
    root = tmp_path / "run" / "checkpoints"
    back = f"checkpoint.load={ckpt.iter_dir(root, 4)}"
    code, log = train(make_cfg(*run, back, "runtime.exit_duration_mins=0.001"))  # B: 5
    assert code == EXIT_TIME_BUDGET, log.text()
    (root / ckpt.MARKER).write_text("8\n")  # back to A at 8, Megatron-LM's way
    code, log = train(make_cfg(*run))  # A on from 8: its 12 saved again
    assert code == EXIT_DONE, log.text()
    (root / ckpt.MARKER).write_bytes(b"\xff")
    code, log = train(make_cfg(*run))
    assert code == EXIT_DONE, log.text()
    assert metrics(tmp_path / "run")[-1]["detail"].startswith("done: already trained 12 of 12 steps")
    assert [ckpt.origin_of(ckpt.iter_dir(root, it)) for it in (4, 8, 12)] == [None] * 3  # A's, kept


def test_a_pinned_start_relaunched_resumes_its_own_save_and_keeps_the_other_runs(make_cfg, train, tmp_path):
    """Found in review (2026-12-06): a run started by ``checkpoint.load=<iter path>`` and stopped went
    back to that checkpoint when the same command was relaunched (a Slurm requeue reruns the same
    arguments), losing its steps; and pruning, once its saves passed the other run's iterations, kept
    the other run's and deleted its own. Now the trajectory records its origin (``TrainerState.origin``):
    the relaunch resumes its own newest save, and ``keep_last`` counts only its checkpoints."""
    from training.signals import EXIT_TIME_BUDGET

    long = ("training.train_iters=12", "checkpoint.keep_last=3")
    code, log = train(make_cfg(*long))  # iterations 4, 8 and 12
    assert code == EXIT_DONE, log.text()
    root = tmp_path / "run" / "checkpoints"
    first = {r["step"]: r["loss"] for r in metrics(tmp_path / "run") if r["kind"] == "train"}
    pin = ckpt.iter_dir(root, 4)
    # back to step 4, saving every 3 steps and keeping 2: one step, then the time budget's stop save
    command = (
        f"checkpoint.load={pin}",
        "training.train_iters=12",
        "checkpoint.save_interval=3",
        "checkpoint.keep_last=2",
    )
    code, log = train(make_cfg(*command, "runtime.exit_duration_mins=0.001"))
    assert code == EXIT_TIME_BUDGET, log.text()
    assert ckpt.complete_iterations(root) == [4, 5, 8, 12] and ckpt.origin_of(ckpt.iter_dir(root, 5)) == str(
        pin
    )
    assert ckpt.origin_of(pin) is None and ckpt.origin_of(ckpt.iter_dir(root, 8)) is None
    code, log = train(make_cfg(*command))  # the same command again, as a requeue runs it
    assert code == EXIT_DONE, log.text()
    assert (
        f"checkpoint: checkpoint.load={pin} started this run, which has saved since: resuming from its own "
        f"newest save, {ckpt.iter_dir(root, 5)} (to start from {pin} again, use another "
        "runtime.output_dir or checkpoint.dir)"
    ) in log.text()
    events = [(r["event"], r["step"]) for r in metrics(tmp_path / "run") if r["kind"] == "event"]
    assert [e for e in events if e[0] == "resume"][-1] == ("resume", 5) and events[-1] == ("exit", 12)
    again = [r for r in metrics(tmp_path / "run") if r["kind"] == "train"][-7:]
    assert [(r["step"], r["loss"]) for r in again] == [(s, first[s]) for s in range(6, 13)]  # same batches
    # its own 9 and 12 (keep_last 2; 12 replaced the other run's); the other run's 4 and 8 kept, not counted
    assert ckpt.complete_iterations(root) == [4, 8, 9, 12]
    assert [ckpt.origin_of(ckpt.iter_dir(root, it)) for it in (9, 12)] == [str(pin)] * 2
    assert (root / ckpt.MARKER).read_text().strip() == "12"


# out-of-memory errors raised outside PyTorch's caching allocator (training/out_of_memory.py); the
# NCCL text is that of torch's DistBackendError for ncclUnhandledCudaError (NVIDIA/nccl#1410's form)
CUDA_OOM = "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other call"
NCCL_OOM = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3699, unhandled cuda error "
    "(run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\nncclUnhandledCudaError: Call to CUDA "
    "function failed.\nLast error:\nCuda failure 2 'out of memory'"
)


@pytest.mark.parametrize("text", [CUDA_OOM, NCCL_OOM], ids=["cuda", "nccl"])
def test_out_of_memory_outside_the_allocator_exits_6(make_cfg, train, tmp_path, monkeypatch, text):
    from training.signals import EXIT_OUT_OF_MEMORY

    _oom_at(monkeypatch, "train_step", 1, RuntimeError(text))
    code, log = train(make_cfg("checkpoint.save=false"))
    assert code == EXIT_OUT_OF_MEMORY, log.text()
    detail = metrics(tmp_path / "run")[-1]["detail"]
    assert detail.startswith(f"out of GPU memory in step 1 ({text.splitlines()[0]}")
    assert "To fit: training.micro_batch_size=1 (estimated " in detail


def test_other_runtime_errors_still_raise(make_cfg, train, monkeypatch):
    _oom_at(
        monkeypatch, "train_step", 2, RuntimeError("CUDA error: an illegal memory access was encountered")
    )
    with pytest.raises(RuntimeError, match="illegal memory access"):
        train(make_cfg("checkpoint.save=false"))


def test_out_of_memory_inside_a_load_error_is_not_damage(make_cfg, train, tmp_path, monkeypatch):
    """A resume whose load fails with an out-of-memory error wrapped in another exception (as the GPU
    engine's load error when torch DCP gathered it: torch_dist_vetting.dist_load_error) stops with
    exit code 6 and passes over no checkpoint."""
    from training.checkpoint import DamagedCheckpointError
    from training.signals import EXIT_OUT_OF_MEMORY

    code, log = train(make_cfg())
    assert code == EXIT_DONE, log.text()
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB.")
        except torch.OutOfMemoryError as oom:
            raise DamagedCheckpointError("iter_0000004 cannot be loaded") from oom
    except DamagedCheckpointError as err:
        wrapped = err
    _oom_at(monkeypatch, "load", 1, wrapped)
    code, log = train(make_cfg())
    assert code == EXIT_OUT_OF_MEMORY, log.text()
    detail = metrics(tmp_path / "run")[-1]["detail"]
    assert detail.startswith(
        "out of GPU memory at start-up (the model, the optimizer or the checkpoint load) ("
    )
    assert "(CUDA out of memory. Tried to allocate 8.00 GiB." in detail
    assert "damaged" not in log.text() and "resuming from the previous" not in log.text()


def test_a_run_of_over_100m_tokens_on_the_sample_corpus_is_refused(train, tmp_path):
    """Found in review (2026-12-06): the README's 64-GPU launch of an 8B config (data.corpus: default
    until a blend replaces it) would have trained 53 h on ~11,000 passes of the sample corpus, with a
    warning in the log. Over 100M tokens on it: exit code 2 before anything is built or written."""
    from training.config import load_config
    from training.signals import EXIT_CONFIG

    cfg = load_config(None, ["training.train_iters=100000", f"runtime.output_dir={tmp_path / 'run'}"])
    code, log = train(cfg)
    assert code == EXIT_CONFIG, log.text()
    assert (
        "pretrain_llama: configuration error: data.corpus is 'default', the embedded sample corpus (about 9M "
        "tokens, data/corpus.py): 102,400,000 training tokens would repeat it about 11 times, which a "
        "training run refuses."
    ) in log.text()
    assert not (tmp_path / "run").exists()


def test_start_up_warns_of_passes_over_the_sample_corpus():
    from training.config import load_config
    from training.data_setup import build_data

    # the default job with 40,000 steps of 4 x 256 tokens: 41M tokens over the ~8.8M-token sample corpus
    cfg = load_config(None, ["training.train_iters=40000", "validation.interval=0"])
    lines = []
    bundle = build_data(cfg, model_vocab_size=cfg.llama().vocab_size, log=lines.append)
    warning = [line for line in lines if line.startswith("data: warning:")]
    assert len(warning) == 1 and "passes over the embedded default corpus" in warning[0], lines
    assert (
        warning[0].startswith("data: warning: 40,960,000 training tokens are ")
        and "README, Your data" in warning[0]
    )
    assert bundle.train is not None
    # the default job itself (80 steps): no warning
    lines.clear()
    build_data(load_config(None), model_vocab_size=cfg.llama().vocab_size, log=lines.append)
    assert not [line for line in lines if "warning" in line], lines


def test_wandb_asked_for_but_not_installed_stops_before_writing(make_cfg, train, tmp_path):
    """Found in review (2026-12-06): logging.wandb_mode=online without the package trained on, and the
    summary then said wandb_mode=disabled. Now: exit code 2 at start-up, naming both remedies."""
    import importlib.util

    from training.signals import EXIT_CONFIG

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    code, log = train(make_cfg("logging.wandb_mode=offline"))
    assert code == EXIT_CONFIG, log.text()
    assert (
        "pretrain_llama: configuration error: logging.wandb_mode=offline needs the 'wandb' package, which "
        "is not installed here: pip install -e '.[wandb]' in the job's environment, or "
        "logging.wandb_mode=disabled"
    ) in log.text()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_fresh_start_into_a_run_directory_with_metrics_warns(make_cfg, train, tmp_path):
    """Found in review (2026-12-06): two runs without checkpoints (checkpoint.save=false, e.g. a bf16
    and an fp8 benchmark) in one runtime.output_dir appended to one metrics.jsonl without a word; and
    (a later review) the file's readers then read the first run's later steps as the second's."""
    from training.metrics import read_metrics

    over = ("checkpoint.save=false", "validation.interval=0")
    code, log = train(make_cfg(*over, "training.train_iters=5", "attention.recipe=bf16"))
    assert code == EXIT_DONE and "metrics: WARNING" not in log.text(), log.text()
    code, log = train(make_cfg(*over, "training.train_iters=3"))
    assert code == EXIT_DONE, log.text()
    assert (
        f"metrics: WARNING: a fresh start, but {tmp_path / 'run' / 'metrics.jsonl'} already holds 5 training "
        "record(s) of an earlier run (steps 1-5): this run's are appended after them, and the readers of the "
        "file (training.records) read only this run's from here on; use another runtime.output_dir to keep "
        "runs apart"
    ) in log.text()
    recs = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in recs if r["kind"] == "train"] == [1, 2, 3]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    second = [json.loads(x) for x in lines[[i for i, x in enumerate(lines) if '"start"' in x][1] :]]
    assert [r for r in recs if r["kind"] == "train"] == [r for r in second if r["kind"] == "train"]


def test_start_up_errors_name_the_config_keys(make_cfg, train, tmp_path):
    """Found in review (2026-12-06): the backend error named the library's argument
    (``backend='reference'``), and a run directory given to checkpoint.load had no hint."""
    from training.signals import EXIT_CONFIG

    code, log = train(make_cfg("attention.backend=triton"))
    assert code == EXIT_CONFIG
    assert (
        "pretrain_llama: configuration error: attention.backend=triton: triton backend needs a CUDA device, "
        "not cpu; use backend='reference' (in the config: attention.backend=auto picks the fastest that runs "
        "here, attention.backend=reference runs anywhere)"
    ) in log.text()
    code, log = train(make_cfg("training.train_iters=4"))  # a run with a checkpoint (step 4)
    assert code == EXIT_DONE, log.text()
    run = tmp_path / "run"
    code, log = train(make_cfg(f"checkpoint.load={run}", run="other"))
    assert code == EXIT_CONFIG, log.text()
    assert (
        f"checkpoint.load={run} holds no complete checkpoint (did you mean {run / 'checkpoints'}, the "
        "checkpoint directory inside it, or one of its iter_* folders?); use checkpoint.load=auto or none, "
        "or name a checkpoint directory or an iter_* folder"
    ) in log.text()
