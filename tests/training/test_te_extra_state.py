"""Vetting of Transformer Engine's pickled FP8 extra state before a resume (training/te_extra_state.py).

TE itself is not needed: the payloads are built here the way ``get_extra_state`` builds them
(``pickle.dumps`` of a dict of CPU tensors and plain values, as a uint8 tensor), and the refused ones
carry what a hostile checkpoint could. The real TE payload (a ``TEDelayedScaling`` recipe) runs in
the TE GPU tests (``test_train_te_gpu.py``: delayed scaling resumes)."""

from __future__ import annotations

import io
import os
import pickle
from collections import OrderedDict

import pytest
import torch

from training.te_extra_state import (
    UNSAFE_PICKLE_ENV,
    UnsafeExtraStateError,
    allow_vetted_te_extra_state,
    vet_extra_state,
)


def as_extra_state(obj) -> torch.Tensor:
    """What TE stores: the pickle's bytes as a uint8 tensor."""
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def scaling_state() -> dict:
    """The shape of a delayed-scaling extra state, without the recipe object."""
    return {
        "scale_fwd": torch.ones(3),
        "amax_history_fwd": torch.rand(16, 3),
        "scale_bwd": torch.ones(2),
        "amax_history_bwd": torch.rand(16, 2),
        "extra_fp8_variables": {"fp8_checkpoint": True, "num_gemms": 1, "fp8_max_fwd": 448.0},
        "hooks": OrderedDict(),
    }


class _RunsCode:
    """Unpickles to a call of ``os.system``: what a hostile extra state could hold."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_scaling_state_passes_and_is_repickled():
    """What TE gets is pickle.dumps of the objects the vetting built, equal to the saved ones."""
    state = scaling_state()
    out = vet_extra_state("layer._extra_state", as_extra_state(state))
    assert out.dtype == torch.uint8 and out.dim() == 1
    loaded = pickle.loads(out.numpy().tobytes())
    assert loaded.keys() == state.keys() and loaded["extra_fp8_variables"] == state["extra_fp8_variables"]
    for k in ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"):
        assert torch.equal(loaded[k], state[k]), k


@pytest.mark.parametrize("value", [None, torch.empty(0, dtype=torch.uint8), torch.empty(0, 4)])
def test_values_without_a_pickle_pass_unchanged(value):
    assert vet_extra_state("layer._extra_state", value) is value


@pytest.mark.parametrize("dtype", [torch.int8, torch.float32])
def test_a_pickle_in_a_tensor_of_another_dtype_is_vetted(tmp_path, dtype):
    """TE's set_extra_state unpickles the bytes of a tensor of any dtype: so does the vetting."""
    marker = tmp_path / "ran"
    data = bytearray(pickle.dumps(_RunsCode(marker)))
    data += b"\0" * (-len(data) % 4)  # whole float32 elements; pickle stops at its STOP opcode
    bad = torch.frombuffer(data, dtype=torch.uint8).view(dtype)
    with pytest.raises(UnsafeExtraStateError, match=r"(posix|os)\.system"):
        vet_extra_state("layer._extra_state", bad)
    assert not marker.exists()


def test_a_value_that_is_not_a_tensor_is_refused():
    with pytest.raises(UnsafeExtraStateError, match="of type int"):
        vet_extra_state("layer._extra_state", 7)


def test_a_global_outside_the_allow_list_is_refused_and_not_called(tmp_path):
    marker = tmp_path / "ran"
    bad = as_extra_state({"scale_fwd": torch.ones(3), "x": _RunsCode(marker)})
    with pytest.raises(UnsafeExtraStateError, match=r"decoder\.x\._extra_state: .*(posix|os)\.system"):
        vet_extra_state("decoder.x._extra_state", bad)
    assert not marker.exists()


def test_a_tensor_storage_holding_code_is_refused(tmp_path):
    """A storage's bytes are a torch.save blob: read with weights_only=True, so code hidden in it is
    refused (the unpickler allows torch.storage._load_from_bytes but not what it would load)."""
    marker = tmp_path / "ran"
    blob = io.BytesIO()
    torch.save({"x": _RunsCode(marker)}, blob)
    from torch.storage import _load_from_bytes

    class Storage:
        def __reduce__(self):
            return (_load_from_bytes, (blob.getvalue(),))

    with pytest.raises(UnsafeExtraStateError, match="does not unpickle as FP8 scaling state"):
        vet_extra_state("layer._extra_state", as_extra_state({"scale_fwd": Storage()}))
    assert not marker.exists()


def test_truncated_bytes_are_refused():
    good = as_extra_state(scaling_state())
    with pytest.raises(UnsafeExtraStateError, match="does not unpickle"):
        vet_extra_state("layer._extra_state", good[: good.numel() // 2].clone())


def test_the_deprecated_bytesio_form_is_refused():
    with pytest.raises(UnsafeExtraStateError, match="io.BytesIO"):
        vet_extra_state("layer._extra_state", io.BytesIO(b"x"))


@pytest.mark.parametrize("before", [None, "0"])
def test_te_opt_in_only_inside_the_block(monkeypatch, before):
    if before is None:
        monkeypatch.delenv(UNSAFE_PICKLE_ENV, raising=False)
    else:
        monkeypatch.setenv(UNSAFE_PICKLE_ENV, before)
    saved = as_extra_state(scaling_state())
    state = {"w": torch.ones(2), "layer._extra_state": saved}
    with allow_vetted_te_extra_state(state):
        assert os.environ[UNSAFE_PICKLE_ENV] == "1"
        assert state["layer._extra_state"] is not saved  # TE reads the re-pickled objects
    assert os.environ.get(UNSAFE_PICKLE_ENV) == before
    with pytest.raises(RuntimeError, match="boom"), allow_vetted_te_extra_state(state):
        raise RuntimeError("boom")
    assert os.environ.get(UNSAFE_PICKLE_ENV) == before


def test_nothing_is_allowed_when_one_entry_is_refused(monkeypatch, tmp_path):
    monkeypatch.delenv(UNSAFE_PICKLE_ENV, raising=False)
    state = {
        "a._extra_state": as_extra_state(scaling_state()),
        "b._extra_state": as_extra_state(_RunsCode(tmp_path / "ran")),
    }
    entered = False
    with pytest.raises(UnsafeExtraStateError, match=r"^b\._extra_state"):
        with allow_vetted_te_extra_state(state):
            entered = True
    assert not entered and UNSAFE_PICKLE_ENV not in os.environ
