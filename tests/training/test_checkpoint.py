"""Checkpoint directory protocol: completeness, checksums, latest marker, fall-back, retention, resume."""

from __future__ import annotations

import json
import shutil

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


def test_retention_keeps_the_saving_trajectory_and_leaves_later_iterations(tmp_path):
    """A run resumed from iteration 10 while 20 and 30 exist (a rollback): its own saves 12, 14, 16
    are pruned among themselves; 20 and 30 stay until a save at their iteration replaces them. Before
    the fix the newest two of all (20, 30) were kept and the run's own saves deleted as they came."""
    for it in (10, 20, 30):
        fake_save(tmp_path, it, keep_last=5)
    for it in (12, 14, 16):
        fake_save(tmp_path, it, keep_last=2)
        assert ckpt.iter_dir(tmp_path, it).is_dir() and (tmp_path / ckpt.MARKER).read_text() == f"{it}\n"
    assert ckpt.complete_iterations(tmp_path) == [14, 16, 20, 30]
    assert ckpt.find_latest(tmp_path) == (16, tmp_path / "iter_0000016")  # the marker's, not 30
    fake_save(tmp_path, 20, keep_last=2, payload=b"y" * 50)  # replaces the other trajectory's 20
    assert ckpt.complete_iterations(tmp_path) == [16, 20, 30]
    assert ckpt.read_json(tmp_path / "iter_0000020" / "manifest.json")["files"]["model.pt"] == 50


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
    assert "truncated" in warnings[0] and "iteration 20) is incomplete or damaged" in warnings[1]
    # manifest missing
    (tmp_path / "iter_0000010" / "manifest.json").unlink()
    assert ckpt.find_latest(tmp_path, warn=warnings.append) is None
    # the next save removes the stale .tmp dir, and a marker's temporary file left by a kill
    marker_tmp = tmp_path / f"{ckpt.MARKER}.tmp-4242"
    marker_tmp.write_text("3")
    fake_save(tmp_path, 40)
    assert not tmp.exists() and not marker_tmp.exists()
    assert (tmp_path / ckpt.MARKER).read_text() == "40\n"


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
    assert (
        "data.identity" in msg
        and "backend" not in msg.split("If this")[0]
        and "output_dir" not in msg.split("If this")[0]
    )
    assert "checkpoint.allow_config_change=[attention.recipe,model.hidden_size,data.identity]" in msg
    allowed = ckpt.check_resume_compatible(
        saved,
        now,
        allow=["model", "attention.recipe", "data.identity"],
        saved_data_identity="x",
        data_identity="y",
    )
    assert len(allowed) == 3


def test_a_checkpoint_from_before_the_fp8_weight_cache_key_resumes():
    """A config saved before projection.fp8_weight_cache existed (no such key) meant the cache on
    (megatron-core's default): it resumes under the 8B FP8 recipe (on), while turning the cache off
    on resume is a change to allow (with delayed scaling it changes the FP8 weights of micro-batches
    2..K), as is any other projection key."""
    from training.config import load_config
    from training.resolved import resolved_dict

    now = resolved_dict(load_config("configs/llama3_1_8b_100b_fp8.yaml"))
    saved = json.loads(json.dumps(now))
    del saved["projection"]["fp8_weight_cache"]
    assert now["projection"]["fp8_weight_cache"] is True
    assert (
        ckpt.check_resume_compatible(saved, now, allow=[], saved_data_identity=None, data_identity=None) == []
    )
    now["projection"]["fp8_weight_cache"] = False
    assert ckpt.config_differences(saved, now) == [("projection.fp8_weight_cache", True, False)]
    with pytest.raises(
        ckpt.ConfigMismatchError, match=r"projection.fp8_weight_cache: True in the checkpoint"
    ):
        ckpt.check_resume_compatible(saved, now, allow=[], saved_data_identity=None, data_identity=None)
    allowed = ckpt.check_resume_compatible(
        saved, now, allow=["projection.fp8_weight_cache"], saved_data_identity=None, data_identity=None
    )
    assert len(allowed) == 1


def _flip_byte(path, offset=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def test_same_size_damage_fails_the_checksum_and_falls_back(tmp_path):
    fake_save(tmp_path, 10)
    final = fake_save(tmp_path, 20)
    manifest = ckpt.read_json(final / ckpt.MANIFEST)
    assert manifest["format"] == 2 and manifest["checksum"] == "crc32"
    assert sorted(manifest["checksums"]) == sorted(manifest["files"])  # every file, the JSON ones too
    assert manifest["checksums"]["model.pt"] == ckpt.file_checksum(final / "model.pt")
    assert manifest["files"]["model.pt"] == 100  # sizes where they always were
    _flip_byte(final / "model.pt")  # one bit, same size: bit rot, a bad copy
    reason = ckpt.verify_checkpoint(final)
    assert f"{final / 'model.pt'} is damaged: its crc32 is" in reason and "the manifest says" in reason
    assert ckpt.verify_checkpoint(final, checksums=False) is None  # sizes alone cannot see it
    warnings = []
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (10, tmp_path / "iter_0000010")
    assert "skipping iteration 20" in warnings[0] and "model.pt is damaged" in warnings[0]
    assert (
        "iteration 20) is incomplete or damaged; resuming from the previous complete one, iteration 10"
        in (warnings[1])
    )


def _save_from(root, it, origin=None, keep_last=10):
    """A fake save by a trajectory started from ``origin`` (a checkpoint path; None: from scratch)."""
    tmp = ckpt.prepare_tmp_dir(root, it)
    (tmp / "model.pt").write_bytes(b"x" * 100)
    state = {"iteration": it, **({"origin": str(origin)} if origin is not None else {})}
    return ckpt.finish_save(root, it, tmp, config={"a": 1}, trainer_state=state, keep_last=keep_last)


def _rollback(root):
    """Run A saved 10, 20, 30 from scratch; B, started from A's 10 (a rollback), saved 15 and 25."""
    for it in (10, 20, 30):
        _save_from(root, it)
    for it in (15, 25):
        _save_from(root, it, ckpt.iter_dir(root, 10).resolve())


def test_fall_back_keeps_to_the_failed_checkpoints_trajectory(tmp_path):
    """Found in review (2026-12-06): run A saved 10, 20, 30; a rollback B (``checkpoint.load`` of A's 10)
    saved 15 and 25, between A's iterations. B's 25 damaged: the fall-back skips A's 20 (named, with
    its origin) and resumes B's 15; before, it resumed A's 20, the run that was rolled back."""
    _rollback(tmp_path)
    origin = ckpt.iter_dir(tmp_path, 10).resolve()
    _flip_byte(ckpt.iter_dir(tmp_path, 25) / "model.pt")
    warnings = []
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (15, ckpt.iter_dir(tmp_path, 15))
    assert "skipping iteration 25" in warnings[0]
    assert warnings[1] == (
        "checkpoint: WARNING: skipping iteration 20: a checkpoint of another trajectory than iter_0000025's "
        "(started from scratch, or saved before origins were recorded); to resume that trajectory instead, "
        f"name it: checkpoint.load={ckpt.iter_dir(tmp_path, 20)}"
    )
    assert warnings[2].endswith("resuming from the previous complete one of its trajectory, iteration 15")
    # after a load failure of 15 (before=15): B's origin, A's 10, is on B's trajectory; the trace makes
    # the resumed run a trajectory started from A's 10 (itself saved from scratch)
    trace = {}
    assert ckpt.find_latest(tmp_path, warn=warnings.append, before=15, trace=trace) == (
        10,
        ckpt.iter_dir(tmp_path, 10),
    )
    assert trace == {"origin": str(origin)}
    trace.clear()  # no trace where the checkpoint found has the failed one's origin
    assert ckpt.find_latest(tmp_path, warn=warnings.append, before=25, trace=trace)[0] == 15 and not trace
    # A's own 30 damaged: A's 20 is the fall-back, B's 25 is skipped
    _flip_byte(ckpt.iter_dir(tmp_path, 30) / "model.pt")
    (tmp_path / ckpt.MARKER).write_text("30\n")
    warnings.clear()
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (20, ckpt.iter_dir(tmp_path, 20))
    skip = "skipping iteration 25: a checkpoint of another trajectory than iter_0000030's"
    skip += f" (started from {origin})"
    assert skip in warnings[1]


def test_fall_back_by_iteration_where_the_trajectory_is_unknown(tmp_path):
    """Where the trajectory cannot be traced, the fall-back goes by iteration as before origins were
    recorded (review of 2026-12-06): a start checkpoint whose directory moved or whose trainer state is
    damaged, and a failed checkpoint whose trainer state does not match its manifest. (A damaged marker
    after a rollback: B's 25, the checkpoint saved last, A's 30 being damaged too.)"""
    _rollback(tmp_path)
    _flip_byte(ckpt.iter_dir(tmp_path, 30) / "model.pt")
    (tmp_path / ckpt.MARKER).write_bytes(b"\xff\xfe")  # damaged marker: 30 (A's, damaged) then B's 25
    warnings = []
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (25, ckpt.iter_dir(tmp_path, 25))
    # moved: the origins name the old place, so B's history (A's 10) cannot be followed
    moved = tmp_path.parent / (tmp_path.name + "_moved")
    tmp_path.rename(moved)
    b25, a20 = ckpt.iter_dir(moved, 25), ckpt.iter_dir(moved, 20)
    assert ckpt.same_trajectory(ckpt.iter_dir(moved, 15), b25) is True  # the same origin string
    assert ckpt.same_trajectory(a20, b25) is False  # newer than B's start: not B's, wherever it is
    assert ckpt.same_trajectory(ckpt.iter_dir(moved, 10), b25) is None  # the start itself: unplaced
    warnings.clear()
    assert ckpt.find_latest(moved, warn=warnings.append, before=15) == (10, ckpt.iter_dir(moved, 10))
    assert any("the trajectory of iter_0000015 cannot be traced" in w for w in warnings), warnings
    moved.rename(tmp_path)
    # the start checkpoint's trainer state unreadable: A's 5 below it is neither taken nor refused
    (ckpt.iter_dir(tmp_path, 10) / ckpt.TRAINER_STATE_FILE).write_text("{")
    assert ckpt.same_trajectory(ckpt.iter_dir(tmp_path, 10), ckpt.iter_dir(tmp_path, 25)) is True  # the start
    _save_from(tmp_path, 5)
    assert ckpt.same_trajectory(ckpt.iter_dir(tmp_path, 5), ckpt.iter_dir(tmp_path, 25)) is None
    # a failed checkpoint whose trainer state does not match its manifest (whatever file verification
    # named first): its origin may be the damage
    state = ckpt.iter_dir(tmp_path, 25) / ckpt.TRAINER_STATE_FILE
    state.write_text(state.read_text().replace('"origin"', '"origon"'))
    assert ckpt.same_trajectory(ckpt.iter_dir(tmp_path, 20), ckpt.iter_dir(tmp_path, 25)) is None


@pytest.mark.parametrize("marker", ["damaged", "missing"])
def test_without_a_marker_the_checkpoint_saved_last_goes_on(tmp_path, marker):
    """Found in review (2026-12-06): with the marker damaged or missing after a rollback, the newest
    directory was resumed, A's 30: the run rolled back, silently. The checkpoint saved last (its
    manifest's ``save`` number in the directory), B's 25, is what the marker named: it is resumed,
    A's 30 named and kept."""
    _rollback(tmp_path)
    if marker == "damaged":
        (tmp_path / ckpt.MARKER).write_bytes(b"\xff")
    else:
        (tmp_path / ckpt.MARKER).unlink()
    warnings = []
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (25, ckpt.iter_dir(tmp_path, 25))
    assert (
        f"checkpoint: WARNING: no marker names the checkpoint to resume; the one saved last into {tmp_path} "
        "is iteration 25 (save 5), and iteration(s) 30 (save 3) above it were saved before it, by a run "
        "rolled back since: resuming from 25 (they are kept; to resume one of them instead, name it: "
        "checkpoint.load=<its iter_* path>)"
    ) in warnings
    assert [ckpt.save_number(ckpt.iter_dir(tmp_path, it), tmp_path) for it in (10, 15, 20, 25, 30)] == [
        1,
        4,
        2,
        5,
        3,
    ]
    if marker == "missing":
        assert (
            f"checkpoint: WARNING: {tmp_path / ckpt.MARKER} is missing; looking for the checkpoint saved "
            "last instead"
        ) in warnings
    # B's 25 damaged as well: back on B's trajectory (its 15), not to A's 20 or 30
    _flip_byte(ckpt.iter_dir(tmp_path, 25) / "model.pt")
    warnings.clear()
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (15, ckpt.iter_dir(tmp_path, 15))
    skip = "skipping iteration 20: a checkpoint of another trajectory than iter_0000025's"
    assert any(skip in w for w in warnings)
    # a rollback of B (C from B's 15, saved 17): saved last, though A's 30 and B's 25 are newer
    _save_from(tmp_path, 17, ckpt.iter_dir(tmp_path, 15).resolve())
    (tmp_path / ckpt.MARKER).unlink()
    assert ckpt.find_latest(tmp_path, warn=lambda _: None) == (17, ckpt.iter_dir(tmp_path, 17))


def test_without_a_marker_a_rollback_by_marker_and_back_goes_on_with_the_last_save(tmp_path):
    """From the review of the first fix (2026-12-06), which took the trajectory started from another's
    checkpoint as the newer: A saved 4, 8, 12; B, started from A's 4, saved 5; then the marker was
    edited back to 8 (Megatron-LM's rollback) and A went on, saving 12 again. A's 12 is the last save,
    though B started from A's checkpoint; resuming B would have replaced A's 8 and 12 with B's."""
    for it in (4, 8, 12):
        _save_from(tmp_path, it)
    _save_from(tmp_path, 5, ckpt.iter_dir(tmp_path, 4).resolve())
    (tmp_path / ckpt.MARKER).write_text("8\n")
    _save_from(tmp_path, 12)  # A on from 8
    (tmp_path / ckpt.MARKER).write_bytes(b"\x00")
    warnings = []
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (12, ckpt.iter_dir(tmp_path, 12))
    assert not any("saved before it" in w for w in warnings)


def test_without_a_marker_a_replaced_start_does_not_mislead(tmp_path):
    """A saved 10, 20, 30; B from A's 20 saved 25; C from A's 10 saved 15, 20 (replacing B's start) and
    22. Following origins through the replaced 20 makes B look like C's descendant; the last save, C's
    22, is what the marker named (review of 2026-12-06)."""
    for it in (10, 20, 30):
        _save_from(tmp_path, it)
    _save_from(tmp_path, 25, ckpt.iter_dir(tmp_path, 20).resolve())
    for it in (15, 20, 22):
        _save_from(tmp_path, it, ckpt.iter_dir(tmp_path, 10).resolve())
    (tmp_path / ckpt.MARKER).unlink()
    assert ckpt.find_latest(tmp_path, warn=lambda _: None) == (22, ckpt.iter_dir(tmp_path, 22))


def _strip_save_numbers(root, *its):
    for it in its:
        manifest = ckpt.iter_dir(root, it) / ckpt.MANIFEST
        old = json.loads(manifest.read_text())
        for key in ("save", "saved_in"):
            del old[key]
        manifest.write_text(json.dumps(old))


def test_without_a_marker_an_iteration_of_unknown_order_above_goes_by_iteration(tmp_path):
    """From the review of 2026-12-06: where an iteration above the last numbered save has no number in
    this directory, its place in the order is unknown and the newest directory is resumed, as before
    the field: checkpoints saved before it (an older checkout saving 20 and 30 after a new one saved
    10), one whose manifest is damaged (verification then names it), and one copied in from another
    run's directory (its number counts that directory's saves)."""
    for it in (10, 20, 30):
        _save_from(tmp_path, it)
    _strip_save_numbers(tmp_path, 20, 30)
    assert ckpt.save_number(ckpt.iter_dir(tmp_path, 30), tmp_path) is None
    (tmp_path / ckpt.MARKER).unlink()
    warnings = []
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (30, ckpt.iter_dir(tmp_path, 30))
    assert (
        "checkpoint: WARNING: no marker names the checkpoint to resume, and the save order of iteration(s) "
        "20, 30 is unknown (saved before saves were numbered, into another directory or by another path to "
        "it, or a damaged manifest): going by iteration"
    ) in warnings
    # the last save's manifest damaged: by iteration, and its verification names the manifest
    root = tmp_path / "b"
    for it in (10, 20, 30):
        _save_from(root, it)
    (ckpt.iter_dir(root, 30) / ckpt.MANIFEST).write_bytes(b"{garbage")
    (root / ckpt.MARKER).unlink()
    warnings = []
    assert ckpt.find_latest(root, warn=warnings.append) == (20, ckpt.iter_dir(root, 20))
    assert any(
        "skipping iteration 30" in w and "manifest.json is missing or unreadable" in w for w in warnings
    )
    assert not any("saved before it" in w for w in warnings)
    # another run's checkpoint copied in, saved after ours (a higher number of its own directory)
    other = tmp_path / "other"
    for it in (100, 200, 300, 400, 500):
        _save_from(other, it)
    mine = tmp_path / "mine"
    for it in (1000, 2000, 3000):
        _save_from(mine, it)
    shutil.copytree(ckpt.iter_dir(other, 500), ckpt.iter_dir(mine, 500))
    assert ckpt.save_number(ckpt.iter_dir(mine, 500), mine) is None
    (mine / ckpt.MARKER).unlink()
    assert ckpt.find_latest(mine, warn=lambda _: None) == (3000, ckpt.iter_dir(mine, 3000))


def test_without_a_marker_the_order_is_the_directorys_not_a_clock(tmp_path):
    """From the review of 2026-12-06: a relaunch on a node whose clock is an hour behind saves 30 after
    20. Ordered by the save times, 30 looked older and was passed over (a later save then replaced
    it); the saves' numbers in the directory do not depend on clocks."""
    for it in (10, 20, 30):
        _save_from(tmp_path, it)
    manifest = ckpt.iter_dir(tmp_path, 30) / ckpt.MANIFEST
    skewed = json.loads(manifest.read_text())
    skewed["saved_at"] -= 3600
    manifest.write_text(json.dumps(skewed))
    (tmp_path / ckpt.MARKER).unlink()
    warnings = []
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (30, ckpt.iter_dir(tmp_path, 30))
    assert not any("saved before it" in w for w in warnings)


def test_same_trajectory_follows_a_rollback_of_a_rollback(tmp_path):
    """C started from B's 15, B from A's 10: A's 5 and 10 and B's 12 and 15 are C's history, A's 20 and
    B's 25 are not; a failed checkpoint whose trainer state cannot be read has no known trajectory."""
    for it in (5, 10, 20):
        _save_from(tmp_path, it)
    for it in (12, 15, 25):
        _save_from(tmp_path, it, ckpt.iter_dir(tmp_path, 10).resolve())
    for it in (17, 30):
        _save_from(tmp_path, it, ckpt.iter_dir(tmp_path, 15).resolve())
    c = ckpt.iter_dir(tmp_path, 30)
    on = {it: ckpt.same_trajectory(ckpt.iter_dir(tmp_path, it), c) for it in (5, 10, 12, 15, 17, 20, 25)}
    assert on == {5: True, 10: True, 12: True, 15: True, 17: True, 20: False, 25: False}
    (ckpt.iter_dir(tmp_path, 30) / ckpt.TRAINER_STATE_FILE).write_text("{not json")
    assert ckpt.same_trajectory(ckpt.iter_dir(tmp_path, 20), c) is None
    # started from a checkpoint of another directory: its history is there (A's 5); a checkpoint beside
    # it in its own directory below that start cannot be placed (a copied directory looks the same)
    other = tmp_path / "other"
    _save_from(other, 3)
    _save_from(other, 40, ckpt.iter_dir(tmp_path, 20).resolve())
    assert ckpt.same_trajectory(ckpt.iter_dir(tmp_path, 5), ckpt.iter_dir(other, 40)) is True
    assert ckpt.same_trajectory(ckpt.iter_dir(other, 3), ckpt.iter_dir(other, 40)) is None
    # origins that lead back to themselves (a re-save at the start's iteration): not traceable
    _save_from(other, 20, ckpt.iter_dir(other, 20).resolve())
    _save_from(other, 30, ckpt.iter_dir(other, 20).resolve())
    assert ckpt.same_trajectory(ckpt.iter_dir(other, 3), ckpt.iter_dir(other, 30)) is None


def test_every_rank_walks_rank_0s_reading(tmp_path):
    """``share`` (the trainer's: rank 0's value on every rank) replaces what this process read of the
    directory: a rank whose marker read failed still walks the candidates of rank 0's marker into the
    collective verification, instead of the newest directory (a rank out of step would hang)."""
    _rollback(tmp_path)
    rank0 = (15, ckpt.complete_iterations(tmp_path))  # rank 0's marker names 15 (an edited marker)
    (tmp_path / ckpt.MARKER).write_bytes(b"\x00")  # this rank's read of the marker fails
    seen = []
    got = ckpt.find_latest(tmp_path, warn=lambda _: None, share=lambda mine: (seen.append(mine), rank0)[1])
    assert got == (15, ckpt.iter_dir(tmp_path, 15)) and seen == [(None, [10, 15, 20, 25, 30])]
    # by itself: no marker, so the checkpoint saved last (B's 25, not A's 30)
    assert ckpt.find_latest(tmp_path, warn=lambda _: None)[0] == 25
    # rank 0's marker damaged too: the checkpoint saved last is rank 0's reading as well (here 15, as
    # if this rank's reading of the save numbers differed), and every rank starts from it
    answers = iter([(None, ckpt.complete_iterations(tmp_path)), (15, [])])
    seen.clear()

    def rank0_again(mine):
        seen.append(mine)
        return next(answers)

    got = ckpt.find_latest(tmp_path, warn=lambda _: None, share=rank0_again)
    assert got == (15, ckpt.iter_dir(tmp_path, 15)) and seen == [(None, [10, 15, 20, 25, 30]), (25, [])]


def test_manifest_without_checksums_still_loads(tmp_path):
    """Checkpoints saved before checksums were recorded (format 1: sizes only) stay loadable."""
    final = fake_save(tmp_path, 10)
    manifest = ckpt.read_json(final / ckpt.MANIFEST)
    old = {"format": 1, "iteration": 10, "files": manifest["files"]}
    (final / ckpt.MANIFEST).write_text(json.dumps(old))
    assert ckpt.has_checksums(final) is False
    _flip_byte(final / "model.pt")  # undetectable without checksums: loaded on sizes
    assert ckpt.verify_checkpoint(final) is None
    assert ckpt.find_latest(tmp_path) == (10, final)
    assert ckpt.has_checksums(fake_save(tmp_path, 20)) is True


def test_checksums_are_shared_over_ranks(tmp_path):
    sizes = {f"f{i}": size for i, size in enumerate([900, 500, 400, 300, 300, 100, 50, 0])}
    shares = [ckpt.shard_files(sizes, rank, 3) for rank in range(3)]
    assert sorted(sum(shares, [])) == sorted(sizes)  # disjoint and complete
    loads = [sum(sizes[f] for f in share) for share in shares]
    assert max(loads) - min(loads) <= max(sizes.values())
    assert shares == [ckpt.shard_files(sizes, rank, 3) for rank in range(3)]  # deterministic
    assert ckpt.shard_files(sizes, 0, 1) == sorted(sizes)

    # the ranks' shares of a save, merged, are what one process computes alone
    tmp = ckpt.prepare_tmp_dir(tmp_path, 10)
    for name, size in sizes.items():
        (tmp / name).write_bytes(bytes(range(256)) * (size // 256) + b"z" * (size % 256))
    merged = {k: v for rank in range(3) for k, v in ckpt.checksum_shard(tmp, rank, 3).items()}
    assert sorted(merged) == sorted(sizes)
    final = ckpt.finish_save(tmp_path, 10, tmp, config={}, trainer_state={}, keep_last=2, checksums=merged)
    alone = fake_save(tmp_path / "alone", 10)
    sums = ckpt.read_json(final / ckpt.MANIFEST)["checksums"]
    assert all(sums[k] == ckpt.file_checksum(final / k) for k in sums)
    assert ckpt.read_json(alone / ckpt.MANIFEST)["checksums"]["config.json"] == ckpt.file_checksum(
        alone / "config.json"
    )
    # a rank verifies its share only: the damage is found by the rank that owns the file
    _flip_byte(final / "f0")
    found = [ckpt.verify_checkpoint(final, shard=(rank, 3)) for rank in range(3)]
    owner = next(
        r for r in range(3) if "f0" in ckpt.shard_files(ckpt.read_json(final / ckpt.MANIFEST)["files"], r, 3)
    )
    assert [f is not None for f in found] == [r == owner for r in range(3)]


@pytest.mark.parametrize(
    "content", [b"\x80\x04\x95\xff\x00garbage\xfe", b"", b"forty\n"], ids=["binary", "empty", "text"]
)
def test_damaged_marker_is_named_and_the_newest_complete_checkpoint_is_used(tmp_path, content):
    fake_save(tmp_path, 10)
    fake_save(tmp_path, 20)
    marker = tmp_path / ckpt.MARKER
    marker.write_bytes(content)
    warnings = []
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (20, tmp_path / "iter_0000020")
    assert len(warnings) == 1 and f"{marker} is damaged" in warnings[0]
    assert "looking for the checkpoint saved last" in warnings[0]
    assert ckpt.read_marker(tmp_path, warn=lambda _: None) is None
    fake_save(tmp_path, 30)  # the next save replaces it
    assert ckpt.read_marker(tmp_path) == 30


def test_marker_that_is_a_directory_is_named(tmp_path):
    fake_save(tmp_path, 10)
    marker = tmp_path / ckpt.MARKER
    marker.unlink()
    marker.mkdir()
    warnings = []
    assert ckpt.find_latest(tmp_path, warn=warnings.append) == (10, tmp_path / "iter_0000010")
    assert f"cannot read {marker} (IsADirectoryError" in warnings[0]


@pytest.mark.parametrize("damage", ["random", "zeros", "flipped_header", "truncated"])
def test_a_file_that_does_not_deserialize_names_itself_without_unsafe_advice(tmp_path, damage):
    import os

    import torch

    from training.engine import load_weights_only

    path = tmp_path / "optimizer.pt"
    torch.save({"main": [torch.ones(64)]}, path)
    data = path.read_bytes()
    path.write_bytes(
        {
            "random": os.urandom(len(data)),
            "zeros": bytes(len(data)),
            "flipped_header": data[:100] + bytes([data[100] ^ 0xFF]) + data[101:],
            "truncated": data[: len(data) // 2],
        }[damage]
    )
    with pytest.raises(ckpt.DamagedCheckpointError) as err:
        load_weights_only(path)
    msg = str(err.value)
    assert msg.startswith(f"{path} does not deserialize as a weights-only torch file (")
    assert "weights_only" not in msg.replace("weights-only", "")
