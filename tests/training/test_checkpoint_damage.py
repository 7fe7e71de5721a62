"""Resuming next to damaged checkpoints: same-size bit flips (checksums), files that do not
deserialize, a garbage marker, nothing usable. One 8-step run (saves at 4 and 8) is shared; each test
resumes from a copy of its checkpoints."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from training import checkpoint as ckpt
from training.signals import EXIT_CONFIG, EXIT_DONE

from .conftest import Lines, metrics, tiny_raw


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in metrics(run_dir) if r["kind"] == "train"}


@pytest.fixture(scope="module")
def trained(tiny_corpus, tmp_path_factory):
    """(checkpoints dir, losses per step) of one tiny 8-step run."""
    from training.config import from_dict
    from training.trainer import Trainer

    run = tmp_path_factory.mktemp("trained") / "run"
    log = Lines()
    assert Trainer(from_dict(tiny_raw(run, tiny_corpus)), log=log).run() == EXIT_DONE, log.text()
    return run / "checkpoints", _losses(run)


@pytest.fixture
def resumable(trained, tmp_path):
    """A copy of the trained run's checkpoints at tmp_path/run/checkpoints (make_cfg's run dir)."""
    root = tmp_path / "run" / "checkpoints"
    shutil.copytree(trained[0], root)
    assert ckpt.complete_iterations(root) == [4, 8]
    return root


def _resumed_from_4_and_matches(run_dir, full_losses) -> None:
    events = [(r["event"], r["step"]) for r in metrics(run_dir) if r["kind"] == "event"]
    assert events[0] == ("resume", 4) and events[-1] == ("exit", 8), events
    resumed = _losses(run_dir)
    assert sorted(resumed) == [5, 6, 7, 8]
    assert all(resumed[s] == full_losses[s] for s in resumed)  # bitwise: the older state loaded cleanly
    assert ckpt.verify_checkpoint(ckpt.iter_dir(run_dir / "checkpoints", 8)) is None  # re-saved


def test_a_flipped_bit_fails_the_checksum_and_resumes_from_the_previous(resumable, trained, make_cfg, train):
    opt = ckpt.iter_dir(resumable, 8) / "optimizer.pt"
    data = bytearray(opt.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside a tensor: torch.load reads it without complaint
    opt.write_bytes(bytes(data))
    code, log = train(make_cfg())
    assert code == EXIT_DONE, log.text()
    print("\n".join(x for x in log if "checkpoint" in x or "resume" in x))
    text = log.text()
    assert f"skipping iteration 8: {opt} is damaged: its crc32 is" in text
    assert "latest checkpoint (iteration 8) is incomplete or damaged; resuming from the previous" in text
    _resumed_from_4_and_matches(resumable.parent, trained[1])


def test_a_file_that_does_not_deserialize_falls_back_without_unsafe_advice(
    resumable, trained, make_cfg, train
):
    """An old checkpoint (sizes-only manifest) whose optimizer.pt is garbage of the same size."""
    final = ckpt.iter_dir(resumable, 8)
    opt = final / "optimizer.pt"
    opt.write_bytes(os.urandom(opt.stat().st_size))
    manifest = ckpt.read_json(final / ckpt.MANIFEST)
    (final / ckpt.MANIFEST).write_text(json.dumps({"format": 1, "iteration": 8, "files": manifest["files"]}))
    code, log = train(make_cfg())
    assert code == EXIT_DONE, log.text()
    print("\n".join(x for x in log if "checkpoint" in x or "resume" in x))
    text = log.text()
    assert f"checkpoint: {final} has no checksums in its manifest (saved before they were recorded)" in text
    assert f"checkpoint: WARNING: iteration 8 is damaged: {opt} does not deserialize" in text
    assert "resuming from the previous complete checkpoint, iter_0000004, instead of iteration 8" in text
    assert "weights_only=False" not in text and "weights_only` set to `False" not in text
    _resumed_from_4_and_matches(resumable.parent, trained[1])


def test_a_garbage_marker_is_named_and_the_newest_checkpoint_resumes(resumable, make_cfg, train):
    marker = resumable / ckpt.MARKER
    marker.write_bytes(b"\x00\xff\xfe\x80binary\x00")
    code, log = train(make_cfg())
    assert code == EXIT_DONE, log.text()
    print("\n".join(x for x in log if "checkpoint" in x or "resume" in x))
    assert (
        f"checkpoint: WARNING: {marker} is damaged: 11 bytes that are not an iteration number" in log.text()
    )
    events = [(r["event"], r["step"]) for r in metrics(resumable.parent) if r["kind"] == "event"]
    assert events == [("resume", 8), ("exit", 8)]  # the newest, iteration 8: nothing lost


def test_nothing_usable_stops_and_deletes_nothing(resumable, make_cfg, train):
    for it in (4, 8):
        model = ckpt.iter_dir(resumable, it) / "model.pt"
        with open(model, "r+b") as f:
            f.truncate(100)
    before = sorted(p.name for p in resumable.iterdir())
    code, log = train(make_cfg())
    assert code == EXIT_CONFIG, log.text()
    assert (
        f"pretrain_llama: cannot resume: no usable checkpoint under {resumable}: iteration(s) 4, 8 are "
        "incomplete or damaged" in log.text()
    )
    assert "engine:" not in log.text()  # stopped before the model was built
    assert sorted(p.name for p in resumable.iterdir()) == before


@pytest.mark.parametrize(
    "error, message",
    [
        ("te", "decoder.x._extra_state: it references posix.system, which is not allowed"),
        (
            "torch_dist",
            "iter_0000008/.metadata references posix.system, which torch_dist metadata does not hold",
        ),
    ],
)
def test_a_refused_pickle_stops_without_falling_back(resumable, make_cfg, train, monkeypatch, error, message):
    """A checkpoint with a pickle the vetting refuses (a Transformer Engine extra state,
    ``te_extra_state``; a torch_dist file, ``torch_dist_vetting``) is not a damage: the run stops
    with a configuration error naming it, does not resume from the older checkpoint, and deletes
    nothing. (The CPU engine has neither: its load raises as the GPU engine's vetting would.)"""
    from training.checkpoint import UnsafeCheckpointError
    from training.engine_cpu import CPUEngine
    from training.te_extra_state import UnsafeExtraStateError

    cls = UnsafeExtraStateError if error == "te" else UnsafeCheckpointError

    def refuse(self, path, **kwargs):
        raise cls(message)

    monkeypatch.setattr(CPUEngine, "load", refuse)
    before = sorted(p.name for p in resumable.iterdir())
    code, log = train(make_cfg())
    assert code == EXIT_CONFIG, log.text()
    text = log.text()
    assert f"checkpoint {ckpt.iter_dir(resumable, 8)} was not loaded: {message}" in text, text
    assert "resuming from the previous" not in text
    assert sorted(p.name for p in resumable.iterdir()) == before
