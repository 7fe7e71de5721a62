"""Checkpoint directory protocol: completeness, latest marker, fall-back, retention, compatibility."""

from __future__ import annotations

import pytest

from training import checkpoint as ckpt


def fake_save(root, it, keep_last=3, payload=b"x" * 100):
    tmp = ckpt.prepare_tmp_dir(root, it)
    (tmp / "model.pt").write_bytes(payload)
    return ckpt.finish_save(
        root, it, tmp, config={"a": 1}, trainer_state={"iteration": it}, keep_last=keep_last
    )


def test_save_protocol_and_retention(tmp_path):
    for it in (10, 20, 30, 40):
        fake_save(tmp_path, it, keep_last=2)
    assert (tmp_path / ckpt.MARKER).read_text() == "40\n"
    assert ckpt.complete_iterations(tmp_path) == [30, 40]
    assert ckpt.find_latest(tmp_path) == (40, tmp_path / "iter_0000040")
    assert ckpt.read_json(tmp_path / "iter_0000040" / "manifest.json")["files"]["model.pt"] == 100


def test_layout_names(tmp_path):
    """The on-disk names behind the path helpers (Megatron-LM's; existing checkpoints use them)."""
    assert ckpt.iter_dir(tmp_path, 40) == tmp_path / "iter_0000040"
    assert ckpt.tmp_dir(tmp_path, 40) == tmp_path / "iter_0000040.tmp"
    assert ckpt.rng_file(tmp_path / "iter_0000040", 3) == tmp_path / "iter_0000040" / "rng" / "rank_00003.pt"
    final = fake_save(tmp_path, 40)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000040", "latest_checkpointed_iteration.txt"]
    assert sorted(p.name for p in final.iterdir()) == [
        "config.json",
        "manifest.json",
        "model.pt",
        "trainer_state.json",
    ]


def test_incomplete_saves_never_become_latest(tmp_path):
    fake_save(tmp_path, 10)
    fake_save(tmp_path, 20)
    # a save that died midway: a .tmp dir without manifest, marker untouched
    tmp = ckpt.prepare_tmp_dir(tmp_path, 30)
    (tmp / "model.pt").write_bytes(b"partial")
    warnings = []
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (20, tmp_path / "iter_0000020")
    assert warnings == []
    # newest truncated -> previous complete one, with a warning
    with open(tmp_path / "iter_0000020" / "model.pt", "r+b") as f:
        f.truncate(10)
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (10, tmp_path / "iter_0000010")
    assert "truncated" in warnings[0] and "iteration 20) is incomplete" in warnings[1]
    # manifest missing
    (tmp_path / "iter_0000010" / "manifest.json").unlink()
    assert ckpt.find_latest(tmp_path, warn=warnings.append) is None
    # the next save removes the stale .tmp dir
    fake_save(tmp_path, 40)
    assert not tmp.exists()


def test_compatibility_messages():
    saved = {
        "model": {"num_layers": 2, "hidden_size": 64},
        "attention": {"recipe": "fp8", "backend": "triton"},
        "runtime": {"output_dir": "a"},
    }
    now = {
        "model": {"num_layers": 2, "hidden_size": 128},
        "attention": {"recipe": "bf16", "backend": "reference"},
        "runtime": {"output_dir": "b"},
    }
    with pytest.raises(ckpt.ConfigMismatchError) as err:
        ckpt.check_resume_compatible(saved, now, allow=[], saved_data_identity="x", data_identity="y")
    msg = str(err.value)
    assert "model.hidden_size: 64 in the checkpoint, 128 now" in msg and "attention.recipe" in msg
    assert "data.identity" in msg and "backend" not in msg.split("If this")[0] and "output_dir" not in msg
    assert "checkpoint.allow_config_change=[attention.recipe,model.hidden_size,data.identity]" in msg
    allowed = ckpt.check_resume_compatible(
        saved,
        now,
        allow=["model", "attention.recipe", "data.identity"],
        saved_data_identity="x",
        data_identity="y",
    )
    assert len(allowed) == 3
