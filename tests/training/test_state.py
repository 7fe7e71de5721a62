"""TrainerState: state_dict / load_state_dict, and the trainer_state.json of existing checkpoints."""

from __future__ import annotations

import pytest

from training import checkpoint as ckpt
from training.state import TrainerState

# trainer_state.json as the trainer wrote it before TrainerState (a dict literal through write_json)
OLD_FILE = """{
 "consumed_samples": 32,
 "consumed_tokens": 1024,
 "data_identity": "3f2a9c",
 "iteration": 8,
 "nonfinite_count": 1,
 "world_size": 2
}"""
# ... and the state it holds
OLD_STATE = dict(
    iteration=8,
    consumed_samples=32,
    consumed_tokens=1024,
    nonfinite_count=1,
    data_identity="3f2a9c",
    world_size=2,
)


def test_state_dict_round_trip():
    state = TrainerState(**OLD_STATE)
    loaded = TrainerState()
    loaded.load_state_dict(state.state_dict())
    assert loaded == state and loaded is not state
    assert TrainerState.from_state_dict(state.state_dict()) == state
    assert state.applied_updates == 7
    assert TrainerState().state_dict() == {
        "iteration": 0,
        "consumed_samples": 0,
        "consumed_tokens": 0,
        "nonfinite_count": 0,
        "data_identity": None,
        "world_size": None,
    }


def test_reads_and_writes_the_existing_file_format(tmp_path):
    (tmp_path / ckpt.TRAINER_STATE_FILE).write_text(OLD_FILE)
    state = TrainerState.from_state_dict(ckpt.read_json(tmp_path / ckpt.TRAINER_STATE_FILE))
    assert state == TrainerState(**OLD_STATE)
    # saved again, the file is the same, byte for byte
    ckpt.write_json(tmp_path / "again.json", state.state_dict())
    assert (tmp_path / "again.json").read_text() == OLD_FILE


def test_origin_is_written_only_where_set():
    pinned = TrainerState(**OLD_STATE, origin="/ckpt/iter_0000004")
    assert pinned.state_dict()["origin"] == "/ckpt/iter_0000004"
    assert TrainerState.from_state_dict(pinned.state_dict()) == pinned
    assert "origin" not in TrainerState(**OLD_STATE).state_dict()


def test_identity_and_world_size_may_be_missing_the_counters_not():
    old = {"iteration": 4, "consumed_samples": 16, "consumed_tokens": 512, "nonfinite_count": 0}
    state = TrainerState.from_state_dict(old)
    assert (state.iteration, state.data_identity, state.world_size) == (4, None, None)
    with pytest.raises(KeyError, match="consumed_tokens"):
        TrainerState.from_state_dict({"iteration": 4, "consumed_samples": 16, "nonfinite_count": 0})
