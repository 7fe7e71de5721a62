"""tools/compare_runs.py on synthetic run directories with a known gap."""

from __future__ import annotations

import json

import compare_runs
import numpy as np
import pytest
from runcompare import CompareError, Options, compare

from tests.tools.conftest import synth_losses

FP4 = "nvfp4_qk_fp8_pv"
NB = 300  # bootstrap replicates in tests


def _opt(**kw):
    kw.setdefault("n_boot", NB)
    kw.setdefault("windows", 8)
    return Options(**kw)


def _two_by_two(make_run, gap, **kw):
    runs = []
    for s in (0, 1):
        runs.append(make_run(f"bf16_s{s}", seed=s, **kw))
        runs.append(make_run(f"fp4_s{s}", recipe=FP4, seed=s, gap=gap, tps=1300.0, **kw))
    return [str(r) for r in runs]


def _coverage(rows, value):
    return np.mean([r["lo"] <= value <= r["hi"] for r in rows])


# (a) two arms x 2 seeds, constant gap 0.05 plus noise
def test_known_gap_two_seeds(make_run):
    res = compare(_two_by_two(make_run, 0.05), _opt())
    (c,) = res["comparisons"]
    assert res["baseline"] == "attn=bf16,proj=bf16"
    assert c["arm"] == f"attn={FP4},proj=bf16" and c["method"] == "hier-paired" and c["n_seeds"] == [2, 2]
    gaps = np.array([r["gap"] for r in c["train_windows"]])
    assert np.all(np.abs(gaps - 0.05) < 0.02), gaps
    for est in (c["train_overall"], c["train_final"]):
        assert abs(est["gap"] - 0.05) < 0.01
        assert est["lo"] <= 0.05 <= est["hi"], est
    assert _coverage(c["train_windows"], 0.05) >= 0.75  # ~90% nominal-ish coverage at 2 seeds
    assert c["train_first_significant_window"] == 0
    # validation records carry the same gap
    assert abs(c["valid_final"]["gap"] - 0.05) < 0.03
    assert c["valid_overall"]["lo"] <= 0.05 <= c["valid_overall"]["hi"]
    assert res["arms"][c["arm"]]["throughput_ratio_vs_baseline"] == pytest.approx(1.3, rel=0.01)


def test_first_significant_window_of_a_late_gap(make_run):
    """Gap 0 over the first half of the tokens, 0.08 after: the first significant window is the
    first window of the second half."""
    n = 400
    step_gap = np.where(np.arange(1, n + 1) > n // 2, 0.08, 0.0)
    runs = []
    for s in (0, 1):
        runs.append(make_run(f"b{s}", seed=s))
        runs.append(
            make_run(f"f{s}", recipe=FP4, seed=s, losses=synth_losses(n, gap=step_gap, seed=s, salt=7))
        )
    res = compare([str(r) for r in runs], _opt(windows=4))
    (c,) = res["comparisons"]
    assert c["train_first_significant_window"] == 2
    assert c["train_significant_windows"] == [2, 3]
    assert abs(c["train_final"]["gap"] - 0.08) < 0.02


# (b) one seed per arm: block bootstrap over steps
def test_known_gap_one_seed_block_bootstrap(make_run):
    """Runs without a per-seed offset: with one seed per arm, seed-to-seed variation cannot be
    estimated (the report warns), so the block bootstrap is checked where it is valid."""
    runs = [
        make_run("bf16", seed=3, seed_offset_sd=0.0),
        make_run("fp4", recipe=FP4, seed=3, gap=0.05, seed_offset_sd=0.0),
    ]
    res = compare([str(r) for r in runs], _opt())
    (c,) = res["comparisons"]
    assert c["method"] == "blocks"
    assert all(r["method"] == "blocks" and r["block_len"] >= 1 for r in c["train_windows"])
    assert c["train_overall"]["lo"] <= 0.05 <= c["train_overall"]["hi"]
    assert c["train_final"]["lo"] <= 0.05 <= c["train_final"]["hi"]
    assert _coverage(c["train_windows"], 0.05) >= 0.75
    assert c["train_first_significant_window"] == 0
    # one seed and 2-3 evaluations per window: no validation interval, said so
    assert c["valid_final"]["lo"] is None and "no interval" in c["valid_final"]["note"]
    assert any("one seed" in w for w in c["warnings"])


def test_seed_bootstrap_requires_two_seeds(make_run):
    runs = [make_run("bf16", seed=3), make_run("fp4", recipe=FP4, seed=3, gap=0.05)]
    with pytest.raises(Exception, match="needs >= 2 runs per arm"):
        compare([str(r) for r in runs], _opt(bootstrap="seeds"))


# (c) zero gap
def test_zero_gap_no_significant_window(make_run):
    res = compare(_two_by_two(make_run, 0.0), _opt(windows=5))
    (c,) = res["comparisons"]
    assert all(r["lo"] <= 0.0 <= r["hi"] for r in c["train_windows"])
    assert c["train_first_significant_window"] is None and c["train_significant_windows"] == []
    assert c["train_overall"]["lo"] <= 0.0 <= c["train_overall"]["hi"]
    assert not c["valid_final"]["significant"]


# (d) fingerprints
def test_config_fingerprint_mismatch_refused(make_run):
    cfg = {"training": {"lr": 3e-4, "seed": 0}, "data": {"seq_length": 1024}, "runtime": {"output_dir": "a"}}
    other = {
        "training": {"lr": 1e-3, "seed": 1},
        "data": {"seq_length": 1024},
        "runtime": {"output_dir": "b"},
    }
    a = make_run("a", seed=0, config=cfg)
    b = make_run("b", recipe=FP4, seed=0, config_fp="deadbeef", config=other)
    with pytest.raises(CompareError) as e:
        compare([str(a), str(b)], _opt())
    msg = str(e.value)
    assert "config fingerprints differ" in msg and "c0ffee: a" in msg and "deadbeef: b" in msg
    assert "--force" in msg
    # the keys that differ are named with their values; keys outside the fingerprint are not
    assert "keys that differ: training.lr (0.0003 in a; 0.001 in b)" in msg
    assert "training.seed" not in msg and "output_dir" not in msg and "seq_length" not in msg
    res = compare([str(a), str(b)], _opt(force=True))
    assert any("forced: config fingerprints differ" in w for w in res["warnings"])


def test_data_order_mismatch_refused_unless_forced(make_run):
    a = make_run("a", seed=0)
    b = make_run("b", recipe=FP4, seed=0, data_fp="0123")
    with pytest.raises(CompareError, match="data order fingerprints differ"):
        compare([str(a), str(b)], _opt())
    res = compare([str(a), str(b)], _opt(force=True))
    assert any("data order" in w for w in res["warnings"])


def test_same_arm_same_seed_refused(make_run):
    runs = [make_run("a", seed=0), make_run("a2", seed=0), make_run("b", recipe=FP4, seed=0)]
    with pytest.raises(CompareError, match="more than one run with seed 0"):
        compare([str(r) for r in runs], _opt())


def test_missing_baseline_refused(make_run):
    c = make_run("c", recipe=FP4, seed=0)
    d = make_run("d", recipe="fp8", projection={"kind": "te_fp8", "recipe": "delayed"}, seed=0)
    with pytest.raises(CompareError, match="no default baseline"):
        compare([str(c), str(d)], _opt())
    res = compare([str(c), str(d)], _opt(baseline=FP4))
    assert res["baseline"] == f"attn={FP4},proj=bf16"
    assert res["comparisons"][0]["arm"] == 'attn=fp8,proj={"kind":"te_fp8","recipe":"delayed"}'


# (e) alignment
def test_misaligned_token_grids_refused(make_run):
    a = make_run("a", seed=0)
    b = make_run("b", recipe=FP4, seed=0, tokens_per_step=2048 * 8)  # another sequence length
    for force in (False, True):  # never interpolated, also with --force
        with pytest.raises(CompareError, match="train token grids differ") as e:
            compare([str(a), str(b)], _opt(force=force))
        assert "a has consumed_tokens=8192" in str(e.value) and "b has 16384" in str(e.value)


def test_different_token_ranges_refused_then_max_tokens(make_run):
    a = make_run("a", seed=0, n_steps=400)
    b = make_run("b", recipe=FP4, seed=0, n_steps=300, gap=0.05)
    with pytest.raises(CompareError, match="train token ranges differ") as e:
        compare([str(a), str(b)], _opt())
    assert "--max-tokens 2457600" in str(e.value)
    res = compare([str(a), str(b)], _opt(max_tokens=300 * 8192))
    assert res["grid"]["last_tokens"] == 300 * 8192 and res["grid"]["n_train_points"] == 300


def test_decreasing_tokens_refused(make_run):
    bad = json.dumps(
        {
            "kind": "train",
            "step": 401,
            "consumed_samples": 0,
            "consumed_tokens": 5,
            "loss": 3.0,
            "grad_norm": 1.0,
            "lr": 1e-4,
            "step_time_s": 1.0,
            "tokens_per_s_per_gpu": 1.0,
            "mfu": None,
            "peak_mem_gib": None,
            "skipped": False,
            "nonfinite_count": 0,
        }
    )
    a = make_run("a", seed=0, extra_lines=[bad])
    b = make_run("b", recipe=FP4, seed=0)
    with pytest.raises(CompareError, match="do not increase with step"):
        compare([str(a), str(b)], _opt())


# (f) resumed run: duplicate steps, last record wins
def test_resumed_run_last_record_wins(make_run):
    n = 400
    good = synth_losses(n, gap=0.05, seed=0, salt=5)
    stale = good.copy()
    stale[300:] += 5.0  # the pre-crash attempt at steps 301..400: garbage that must be replaced
    extra = _relaunch(good, 301, n, "from ckpt 300")
    a = make_run("bf16", seed=0)
    b = make_run("fp4", recipe=FP4, seed=0, losses=stale, extra_lines=extra)
    res = compare([str(a), str(b)], _opt(windows=4))
    row = next(r for r in res["runs"] if r["name"] == "fp4")
    assert row["records_replaced_by_later"] == 100 + 5
    assert row["train_records"] == 400 and row["valid_records"] == 20
    assert row["events"] == {"start": 1, "save": 4, "exit": 1, "resume": 1}
    (c,) = res["comparisons"]
    assert abs(c["train_final"]["gap"] - 0.05) < 0.02  # not ~5: the stale records are gone
    assert abs(c["valid_final"]["gap"] - 0.05) < 0.1


def _train_line(step: int, loss: float) -> str:
    return json.dumps(
        {
            "kind": "train",
            "step": step,
            "consumed_samples": step * 8,
            "consumed_tokens": step * 8192,
            "loss": loss,
            "grad_norm": 1.0,
            "lr": 3e-4,
            "step_time_s": 0.1,
            "tokens_per_s_per_gpu": 1000.0,
            "mfu": None,
            "peak_mem_gib": 1.0,
            "skipped": False,
            "nonfinite_count": 0,
        }
    )


def _relaunch(losses, first: int, last: int, detail: str, lr: float = 3e-4) -> list[str]:
    """The lines a relaunch from step ``first - 1`` appends: its resume event, then train records of
    steps ``first``..``last`` (``losses[step - 1]``, at ``lr``) and a valid record every 20 steps."""
    lines = [json.dumps({"kind": "event", "step": first - 1, "event": "resume", "detail": detail})]
    for step in range(first, last + 1):
        loss = float(losses[step - 1])
        lines.append(json.dumps({**json.loads(_train_line(step, loss)), "lr": lr}))
        if step % 20 == 0:
            lines.append(
                json.dumps(
                    {"kind": "valid", "step": step, "consumed_tokens": step * 8192, "val_loss": loss + 0.1}
                )
            )
    return lines


def test_a_rollbacks_abandoned_steps_are_not_the_runs(make_run):
    """Found in review (2026-12-06): after a rollback (a relaunch from step 200 of a run that had gone
    to 400, stopped at 300), "the last record wins" kept the abandoned branch's steps 301-400 and its
    final validation. A resume event at step k now drops the records of later steps before it."""
    good = synth_losses(300, gap=0.05, seed=0, salt=5)
    abandoned = np.concatenate([good[:200], synth_losses(200, gap=5.0, seed=0, salt=6)])
    extra = _relaunch(good, 201, 300, "from iter 200")
    a = make_run("bf16", seed=0)
    b = make_run("fp4", recipe=FP4, seed=0, losses=abandoned, extra_lines=extra)
    with pytest.raises(CompareError, match="train token ranges differ"):  # b now ends at step 300
        compare([str(a), str(b)], _opt(windows=4))
    res = compare([str(a), str(b)], _opt(windows=4, max_tokens=300 * 8192))
    row = next(r for r in res["runs"] if r["name"] == "fp4")
    assert row["train_records"] == 300 and row["records_replaced_by_later"] == 200 + 10
    (c,) = res["comparisons"]
    assert abs(c["train_final"]["gap"] - 0.05) < 0.02  # not ~5: the abandoned branch is gone
    assert abs(c["valid_final"]["gap"] - 0.05) < 0.1


def test_a_fresh_start_in_the_directory_replaces_the_earlier_runs_records(make_run):
    """Found in review (2026-12-06): a fresh start appended to an earlier run's metrics.jsonl (no
    checkpoint left to resume) was read as one run, the earlier run's later steps and final
    validation with it. A ``start`` event now drops every record read before it."""
    earlier = synth_losses(400, gap=5.0, seed=0, salt=9)  # another run: far off
    good = synth_losses(300, gap=0.05, seed=0, salt=5)
    extra = _relaunch(good, 1, 300, "")
    extra[0] = json.dumps({"kind": "event", "step": 0, "event": "start", "detail": "fresh start, 300 steps"})
    a = make_run("bf16", seed=0)
    b = make_run("fp4", recipe=FP4, seed=0, losses=earlier, extra_lines=extra)
    res = compare([str(a), str(b)], _opt(windows=4, max_tokens=300 * 8192))
    row = next(r for r in res["runs"] if r["name"] == "fp4")
    assert row["train_records"] == 300 and row["records_replaced_by_later"] == 400 + 20
    (c,) = res["comparisons"]
    assert abs(c["train_final"]["gap"] - 0.05) < 0.02 and abs(c["valid_final"]["gap"] - 0.05) < 0.1


def test_a_config_change_allowed_at_a_resume_is_refused(make_run):
    """Found in review (2026-12-06): a data.seed changed at a resume (allowed by
    checkpoint.allow_config_change) compared silently: run_meta.json is the last launch's. The resume
    event's ``allowed_changes`` names it; a rollback below the change, or a fresh start, drops it."""
    good = synth_losses(400, gap=0.05, seed=0, salt=5)
    change = [["data.seed", 99, 1234], ["data.identity", "aa", "bb"]]
    extra = _relaunch(good, 301, 400, "from 300")
    extra[0] = json.dumps({**json.loads(extra[0]), "allowed_changes": change})
    a = make_run("bf16", seed=0)
    b = make_run("fp4", recipe=FP4, seed=0, losses=good, extra_lines=extra)
    with pytest.raises(CompareError) as err:
        compare([str(a), str(b)], _opt(windows=4))
    assert str(err.value) == (
        "fp4: its steps 1-300 were trained under another config than its later steps and its run_meta.json "
        '(data.seed 99 -> 1234, data.identity "aa" -> "bb", allowed at its resume from step 300 by '
        "checkpoint.allow_config_change) (pass --force to compare anyway)"
    )
    res = compare([str(a), str(b)], _opt(windows=4, force=True))
    assert any(w.startswith("forced: fp4: its steps 1-300 were trained") for w in res["warnings"])
    # a rollback to step 200 (before the change) of that run: the change no longer applies
    c = make_run("fp4b", recipe=FP4, seed=0, losses=good, extra_lines=extra + _relaunch(good, 201, 400, "r"))
    res = compare([str(a), str(c)], _opt(windows=4))
    assert not any("trained under another config" in w for w in res["warnings"])
    bad = make_run(
        "fp4c", recipe=FP4, seed=0, losses=good, extra_lines=[extra[0].replace('"data.seed"', "7")]
    )
    with pytest.raises(
        CompareError, match=r"metrics.jsonl:\d+: event record: 'allowed_changes' must be a list"
    ):
        compare([str(a), str(bad)], _opt(windows=4))


def test_prepared_data_that_differ_are_refused(make_run):
    """Found in review (2026-12-06): a corpus prepared again at the same prefix between the arms kept
    the data-order fingerprint (megatron-core's identity names paths); run_meta.json's data_content
    is the files' digest."""
    a = make_run("a", seed=0, data_content="aaaa" * 8)
    b = make_run("b", recipe=FP4, seed=0, data_content="bbbb" * 8)
    with pytest.raises(CompareError, match=r"the prepared data differ \(aaaa.*: a; bbbb.*: b\)"):
        compare([str(a), str(b)], _opt())
    res = compare([str(a), str(b)], _opt(force=True))
    assert any(w.startswith("forced: the prepared data differ") for w in res["warnings"])
    old = make_run("old", recipe=FP4, seed=1)  # before the field: compared, with a warning
    res = compare([str(a), str(old)], _opt())
    assert any("run_meta.json of old records no data_content" in w for w in res["warnings"])


def test_layer_specs_that_differ_are_refused(make_run):
    """Found in review (2026-12-06): the config fingerprint holds model.transformer_impl=auto, so an arm
    run where Transformer Engine imports (TE layers) and one where it does not (local layers) compared
    as one job. run_meta.json's layer_spec records what was built."""
    a = make_run("a", seed=0, layer_spec="transformer_engine")
    b = make_run("b", recipe=FP4, seed=0, layer_spec="local")
    with pytest.raises(CompareError) as err:
        compare([str(a), str(b)], _opt())
    assert str(err.value) == (
        "the layer specs differ (transformer_engine: a; local: b): model.transformer_impl=auto built "
        "Transformer Engine's layers where TE was importable and megatron-core's local ones elsewhere; run "
        "every arm with the same model.transformer_impl=transformer_engine or local (pass --force to compare "
        "anyway)"
    )
    res = compare([str(a), str(b)], _opt(force=True))
    assert any(w.startswith("forced: the layer specs differ") for w in res["warnings"])
    old = make_run("old", recipe=FP4, seed=1)  # recorded before the field: not checked
    assert compare([str(a), str(old)], _opt())["comparisons"]


# (g) NaN / Infinity losses
def test_nonfinite_losses_counted_and_excluded(make_run, tmp_path):
    a = make_run("bf16", seed=0)
    b = make_run("fp4", recipe=FP4, seed=0, gap=0.05, nan_steps=(10, 11, 250))
    inf_line = json.dumps(
        {
            "kind": "train",
            "step": 12,
            "consumed_samples": 96,
            "consumed_tokens": 12 * 8192,
            "loss": float("inf"),
            "grad_norm": float("inf"),
            "lr": 3e-4,
            "step_time_s": 0.1,
            "tokens_per_s_per_gpu": 1000.0,
            "mfu": None,
            "peak_mem_gib": 1.0,
            "skipped": True,
            "nonfinite_count": 3,
        }
    )
    assert "Infinity" in inf_line
    with open(b / "metrics.jsonl", "a") as f:
        f.write(inf_line + "\n")
    res = compare([str(a), str(b)], _opt())
    row = next(r for r in res["runs"] if r["name"] == "fp4")
    assert row["nonfinite"]["train_loss"] == 4  # NaN at 10, 11, 250 and Infinity at 12
    assert row["nonfinite"]["skipped_steps"] == 4
    assert row["nonfinite"]["grad_norm"] == 1
    assert row["nonfinite"]["nonfinite_count_last"] == 3
    assert res["arms"][f"attn={FP4},proj=bf16"]["nonfinite_train_loss"] == 4
    (c,) = res["comparisons"]
    assert all(r["gap"] is not None and np.isfinite(r["gap"]) for r in c["train_windows"])
    assert abs(c["train_overall"]["gap"] - 0.05) < 0.02


def test_all_nan_window_reported_without_gap(make_run):
    a = make_run("bf16", seed=0)
    b = make_run("fp4", recipe=FP4, seed=0, nan_steps=tuple(range(1, 101)))
    res = compare([str(a), str(b)], _opt(windows=4))
    w0 = res["comparisons"][0]["train_windows"][0]
    assert w0["gap"] is None and "no point of this window has a finite loss" in w0["note"]


def test_malformed_line_refused_or_skipped(make_run):
    a = make_run("a", seed=0)
    b = make_run("b", recipe=FP4, seed=0, extra_lines=['{"kind": "train", "step": 3, "loss": "x"', "[1, 2]"])
    with pytest.raises(CompareError, match=r"metrics.jsonl:\d+: not valid JSON"):
        compare([str(a), str(b)], _opt())
    res = compare([str(a), str(b)], _opt(skip_malformed=True))
    assert next(r for r in res["runs"] if r["name"] == "b")["malformed_lines_skipped"] == 2
    c = make_run("c", recipe=FP4, seed=1, extra_lines=[json.dumps({"kind": "train", "step": True})])
    with pytest.raises(CompareError, match="'step' must be int, got bool"):
        compare([str(a), str(c)], _opt())


def test_bad_meta_refused(make_run):
    a = make_run("a", seed=0)
    b = make_run("b", recipe=FP4, seed=0)
    meta = json.loads((b / "run_meta.json").read_text())
    meta["seed"] = "0"
    del meta["precision"]["projection"]
    (b / "run_meta.json").write_text(json.dumps(meta))
    with pytest.raises(CompareError) as e:
        compare([str(a), str(b)], _opt())
    assert "seed must be an int" in str(e.value) and "missing precision.projection" in str(e.value)


def test_window_tokens_and_reproducibility(make_run):
    runs = _two_by_two(make_run, 0.05)
    r1 = compare(runs, _opt(window_tokens=1_000_000, bootstrap_seed=7))
    r2 = compare(runs, _opt(window_tokens=1_000_000, bootstrap_seed=7))
    assert [w["hi_tokens"] for w in r1["windows"]] == [1e6, 2e6, 3e6, 4e6]
    assert r1["comparisons"][0]["train_windows"] == r2["comparisons"][0]["train_windows"]


# (h) CLI end to end
PNG = b"\x89PNG\r\n\x1a\n"


def test_cli_end_to_end(make_run, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    runs = _two_by_two(make_run, 0.05)
    out = tmp_path / "report"
    rc = compare_runs.main([*runs, "--out", str(out), "--windows", "6", "--n-boot", str(NB)])
    assert rc == 0
    for name in ("summary.md", "summary.json", "loss_vs_tokens.png", "gap_vs_tokens.png"):
        assert (out / name).is_file(), name
    for png in ("loss_vs_tokens.png", "gap_vs_tokens.png"):
        assert (out / png).read_bytes()[:8] == PNG
    md = (out / "summary.md").read_text()
    assert "python tools/compare_runs.py" in md and "--windows 6" in md
    assert "abc1234" in md  # the runs' commit
    for needle in (
        "Train-loss gap per window",
        "First significant window",
        "Final validation gap",
        "Non-finite counts",
        "tokens/s/GPU",
        "1.300",
        "compare_runs commit",
        "Date (UTC)",
    ):
        assert needle in md, needle
    data = json.loads((out / "summary.json").read_text())
    (c,) = data["comparisons"]
    assert len(c["train_windows"]) == 6 and data["options"]["n_boot"] == NB
    assert abs(c["train_final"]["gap"] - 0.05) < 0.02
    assert data["tool"]["command"].startswith("python tools/compare_runs.py")
    assert {r["commit"] for r in data["runs"]} == {"abc1234"}


def test_cli_refusal_exit_code(make_run, tmp_path, capsys):
    a = make_run("a", seed=0)
    b = make_run("b", recipe=FP4, seed=0, data_fp="other")
    rc = compare_runs.main([str(a), str(b), "--out", str(tmp_path / "o"), "--no-plots"])
    assert rc == 2
    assert "data order fingerprints differ" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_markdown_escapes_untrusted_strings(make_run, tmp_path):
    ev = json.dumps({"kind": "event", "step": 1, "event": "x|y\n<b>", "detail": ""})
    a = make_run("a", seed=0, extra_lines=[ev])
    b = make_run("b", recipe=FP4, seed=0)
    out = tmp_path / "o"
    assert compare_runs.main([str(a), str(b), "--out", str(out), "--no-plots", "--n-boot", "50"]) == 0
    md = (out / "summary.md").read_text()
    assert "x\\|y &lt;b&gt;: 1" in md and "<b>" not in md


def test_trainer_projection_section_gives_arm_labels(make_run):
    """run_meta.json written by the trainer holds the whole ``projection`` section (a dict): BF16
    projections label as ``bf16`` (the default baseline is found); FP8 projections keep their settings."""
    from training.config import load_config
    from training.resolved import resolved_dict

    proj = resolved_dict(load_config(None, []))["projection"]
    assert isinstance(proj, dict) and proj["precision"] == "bf16"
    runs = [
        str(make_run("bf16", projection=proj)),
        str(make_run("fp8", recipe="fp8", projection=proj, gap=0.02)),
        str(make_run("fp8_te", recipe="fp8", projection={**proj, "precision": "te_fp8"}, gap=0.03)),
    ]
    res = compare(runs, _opt())
    assert res["baseline"] == "attn=bf16,proj=bf16"
    labels = sorted(c["arm"] for c in res["comparisons"])
    assert labels[0] == "attn=fp8,proj=bf16"
    assert labels[1].startswith("attn=fp8,proj=te_fp8{") and '"fp8_format":"hybrid"' in labels[1]


def test_config_differences_without_differing_keys_or_without_config(make_run):
    a = make_run("a", seed=0)
    b = make_run("b", recipe=FP4, seed=0, config_fp="deadbeef")  # same config, another fingerprint
    with pytest.raises(CompareError, match="no fingerprinted key of the configs differs"):
        compare([str(a), str(b)], _opt())
    meta = json.loads((b / "run_meta.json").read_text())
    del meta["config"]
    (b / "run_meta.json").write_text(json.dumps(meta))
    with pytest.raises(CompareError, match="run_meta.json of b holds no config"):
        compare([str(a), str(b)], _opt())


def test_cli_names_config_keys_from_another_directory(make_run, tmp_path):
    """The script finds training.fingerprint from any working directory, without importing torch."""
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(compare_runs.__file__)
    a = make_run("a", seed=0, config={"training": {"lr": 3e-4}})
    b = make_run("b", recipe=FP4, seed=0, config_fp="deadbeef", config={"training": {"lr": 1e-3}})
    res = subprocess.run(
        [sys.executable, str(tool), str(a), str(b), "--no-plots"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 2 and "training.lr (0.0003 in a; 0.001 in b)" in res.stderr, res.stderr
    probe = (
        f"import sys; sys.path.insert(0, {str(tool.parent)!r}); import compare_runs; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "False", out.stderr


def test_one_arm_gives_the_seed_spread(make_run, tmp_path):
    """Seeds of one arm alone: no gap, the seed spread per window and at the last evaluation."""
    n = 200
    runs = []
    for s, offset in ((0, 0.0), (1, 0.1), (2, 0.2)):
        losses = synth_losses(n, gap=offset, seed=0, salt=1, seed_offset_sd=0.0)  # identical noise
        runs.append(str(make_run(f"bf16_s{s}", seed=s, losses=losses)))
    res = compare(runs, _opt(windows=4))
    assert res["comparisons"] == [] and res["baseline"] == "attn=bf16,proj=bf16"
    assert any("one arm" in w and "seed spread only" in w for w in res["warnings"])
    sp = res["seed_spread"]["attn=bf16,proj=bf16"]
    assert sp["seeds"] == [0, 1, 2] and len(sp["train_windows"]) == 4
    for row in sp["train_windows"]:
        assert row["range"] == pytest.approx(0.2) and row["sd"] == pytest.approx(0.1)
        assert row["per_seed"][1] - row["per_seed"][0] == pytest.approx(0.1)
    assert sp["valid_final"]["range"] == pytest.approx(0.2) and sp["valid_final"]["tokens"] == n * 8192
    out = tmp_path / "spread"
    assert compare_runs.main([*runs, "--out", str(out), "--windows", "4", "--n-boot", "50"]) == 0
    md = (out / "summary.md").read_text()
    assert md.startswith("# Seed spread of `attn=bf16,proj=bf16` (one arm: no precision comparison)")
    assert "## Seed spread: `attn=bf16,proj=bf16` (3 seeds)" in md and "| 0.1000 | 0.2000 |" in md
    assert "## Headline" not in md and "Last validation loss" in md
    assert (out / "loss_vs_tokens.png").is_file() and not (out / "gap_vs_tokens.png").exists()


def test_seed_spread_beside_the_gaps(make_run):
    res = compare(_two_by_two(make_run, 0.05), _opt(windows=4))
    assert set(res["seed_spread"]) == {"attn=bf16,proj=bf16", f"attn={FP4},proj=bf16"}
    assert all(r["sd"] is not None for r in res["seed_spread"]["attn=bf16,proj=bf16"]["train_windows"])


def test_cpu_throughput_ratio_is_flagged(make_run, tmp_path):
    runs = [
        make_run("bf16", seed=0, device="cpu"),
        make_run("fp4", recipe=FP4, seed=0, gap=0.05, device="cpu", tps=1300.0),
    ]
    res = compare([str(r) for r in runs], _opt())
    assert any("ran on a CPU" in w and "mean nothing" in w for w in res["warnings"])
    assert res["arms"][f"attn={FP4},proj=bf16"]["throughput_ratio_on_cpu"] is True
    out = tmp_path / "o"
    assert compare_runs.main([*map(str, runs), "--out", str(out), "--no-plots", "--n-boot", "50"]) == 0
    md = (out / "summary.md").read_text()
    assert "1.300 (CPU: meaningless)" in md and "measured on a CPU shared with other work" in md
    gpu = compare([str(make_run("g_bf16", seed=0)), str(make_run("g_fp4", recipe=FP4, seed=0))], _opt())
    assert not any("CPU" in w for w in gpu["warnings"])
    assert gpu["arms"][f"attn={FP4},proj=bf16"]["throughput_ratio_on_cpu"] is False


def _outside_points(ax):
    """(x, y) of every data point of ``ax`` above / below its y limits."""
    from runcompare.plots import DATA_GID

    lo, hi = ax.get_ylim()
    above, below = [], []
    for line in ax.get_lines():
        if line.get_gid() == DATA_GID:
            for x, y in zip(line.get_xdata(), line.get_ydata()):
                if np.isfinite(y) and y > hi:
                    above.append((x, y))
                elif np.isfinite(y) and y < lo:
                    below.append((x, y))
    return above, below


def test_loss_plot_marks_every_point_outside_the_axes(make_run):
    """The zoomed loss panels leave the first points (loss ~11) and the first validation point off
    the axes: each such point has a mark at the edge at its x, and the note gives their count."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from runcompare.plots import loss_figure

    runs = []
    for s in (0, 1):
        runs.append(str(make_run(f"b{s}", seed=s, val_every=10)))
        runs.append(str(make_run(f"f{s}", recipe=FP4, seed=s, gap=0.05, val_every=10)))
    res = compare(runs, _opt(windows=4))
    fig = loss_figure(res)
    try:
        train_ax, val_ax = fig.axes
        for ax in (train_ax, val_ax):
            above, below = _outside_points(ax)
            marks = {
                side: [ln for ln in ax.get_lines() if ln.get_gid() == f"clipped-{side}"]
                for side in ("above", "below")
            }
            notes = {t.get_gid(): t.get_text() for t in ax.texts}
            for side, pts in (("above", above), ("below", below)):
                if not pts:
                    assert not marks[side] and f"clipped-{side}-note" not in notes
                    continue
                (mark,) = marks[side]
                assert {x for x, _ in pts} <= set(mark.get_xdata())
                edge = ax.get_ylim()[1 if side == "above" else 0]
                assert np.allclose(mark.get_ydata(), edge) and not mark.get_clip_on()
                assert notes[f"clipped-{side}-note"].startswith(
                    f"{'^' if side == 'above' else 'v'} {len(pts)} point(s) {side}"
                )
        above, _ = _outside_points(train_ax)
        assert above and min(x for x, _ in above) == 8192  # step 1 is off the zoomed axes, and marked
        above, _ = _outside_points(val_ax)
        assert (10 * 8192) in {x for x, _ in above}  # the first validation point likewise
        assert (
            f"{max(y for _, y in above):.3f}"
            in {t.get_gid(): t.get_text() for t in val_ax.texts}["clipped-above-note"]
        )
    finally:
        plt.close(fig)


def test_learning_rates_that_differ_are_refused(make_run):
    """Found in review (2026-12-06): an LR change allowed on a resume leaves the config fingerprint
    (run_meta.json is rewritten at every launch) as it was; the logged lr shows it."""
    good = synth_losses(400, gap=0.05, seed=0, salt=5)
    extra = _relaunch(good, 301, 400, "lr lowered", lr=1e-4)
    a = make_run("bf16", seed=0)
    b = make_run("fp4", recipe=FP4, seed=0, losses=good, extra_lines=extra)
    with pytest.raises(
        CompareError, match=r"learning rates differ from step 301 on \(bf16 0.0003, fp4 0.0001\)"
    ):
        compare([str(a), str(b)], _opt(windows=4))
    res = compare([str(a), str(b)], _opt(windows=4, force=True))
    assert any(w.startswith("forced: the logged learning rates differ") for w in res["warnings"])
    # configs that differ (forced): the LR change is not blamed on a resume (found in review, 2026-12-06)
    c = make_run("fp4c", recipe=FP4, seed=0, losses=good, extra_lines=extra, config_fp="beef")
    res = compare([str(a), str(c)], _opt(windows=4, force=True))
    assert (
        "forced: the logged learning rates differ from step 301 on (bf16 0.0003, fp4c 0.0001): their configs "
        "differ (the config fingerprints)" in res["warnings"]
    )


def test_one_max_tokens_hint_for_train_and_valid_ranges(make_run):
    """Found in review (2026-12-06): a run stopped between two validations got two hints (the train
    range's end and the last validation's); the train range's end is the one that compares both."""
    a = make_run("a", seed=0, n_steps=400)
    b = make_run("b", recipe=FP4, seed=0, n_steps=390, gap=0.05)  # last validation at step 380
    with pytest.raises(CompareError) as e:
        compare([str(a), str(b)], _opt())
    text = str(e.value)
    assert "train token ranges differ" in text and "valid token ranges differ" in text
    assert text.count(f"--max-tokens {390 * 8192} ") == 2 and f"--max-tokens {380 * 8192}" not in text
    res = compare([str(a), str(b)], _opt(max_tokens=390 * 8192))
    assert res["grid"]["n_train_points"] == 390
