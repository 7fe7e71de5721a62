"""training/torch_dist_vetting.py on torch_dist checkpoints written by torch DCP on the CPU.

megatron-core's ``dist_checkpointing.save`` needs CUDA, but its files are torch DCP's: a ``.metadata``
pickle and ``.distcp`` files holding tensors and the ``torch.save`` bytes of every object. The GPU
resume tests (``tests/training/test_train_gpu.py``, ``test_train_te_gpu.py``) run the vetting on
megatron-core's own checkpoints.
"""

from __future__ import annotations

import argparse
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from training.checkpoint import DamagedCheckpointError, UnsafeCheckpointError
from training.engine_megatron import dcp_tensor_shapes
from training.torch_dist_vetting import read_metadata, vet_torch_dist_checkpoint


class Payload:
    """Pickles as a call of ``os.system``: what a crafted checkpoint would hold."""

    def __init__(self, marker):
        self.cmd = f"touch {marker}"

    def __reduce__(self):
        return (os.system, (self.cmd,))


def save(path, state):
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return path


def state():
    return {
        "w": torch.randn(8, 4, dtype=torch.bfloat16),
        "optimizer": {
            "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "params": [0, 1]}],
            "step": 7,
        },
        "args": argparse.Namespace(seq_length=4096),  # one of megatron-core's safe globals
    }


def test_a_dcp_checkpoint_is_data(tmp_path):
    ckpt = save(tmp_path / "ok", state())
    meta = vet_torch_dist_checkpoint(ckpt)
    objects = {k for k, m in meta.state_dict_metadata.items() if type(m).__name__ == "BytesStorageMetadata"}
    # torch DCP flattens nested containers into one object per leaf
    groups = {f"optimizer.param_groups.0.{k}" for k in ("lr", "betas", "params")}
    assert objects == {*groups, "optimizer.step", "args"}
    assert dcp_tensor_shapes(ckpt) == {"w": (8, 4)}
    assert read_metadata(ckpt).state_dict_metadata.keys() == meta.state_dict_metadata.keys()


def test_a_code_payload_in_an_object_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "ran"
    bad = state()
    bad["optimizer"]["param_groups"] = Payload(marker)
    ckpt = save(tmp_path / "bad", bad)
    assert not marker.exists()
    with pytest.raises(
        UnsafeCheckpointError, match=r"the object 'optimizer.param_groups' is not data: .*posix"
    ):
        vet_torch_dist_checkpoint(ckpt)
    assert not marker.exists()
    # what the vetting stands in front of: torch DCP's own load runs the payload
    target = {"optimizer": {"param_groups": None}}
    dcp.load(target, checkpoint_id=str(ckpt), no_dist=True)
    assert marker.exists()


def test_a_code_payload_in_metadata_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "ran"
    ckpt = save(tmp_path / "bad", state())
    meta = pickle.loads((ckpt / ".metadata").read_bytes())
    meta.planner_data = Payload(marker)
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    for read in (vet_torch_dist_checkpoint, read_metadata, dcp_tensor_shapes):
        with pytest.raises(UnsafeCheckpointError, match=r"\.metadata references posix\.system"):
            read(ckpt)
    assert not marker.exists()


def _rewrite_storage(ckpt, key, **changes):
    meta = pickle.loads((ckpt / ".metadata").read_bytes())
    for index, info in meta.storage_data.items():
        if index.fqn == key:
            for name, value in changes.items():
                setattr(info, name, value)
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))


def test_objects_outside_the_directory_or_with_transforms_are_refused(tmp_path):
    ckpt = save(tmp_path / "a", state())
    (tmp_path / "outside.distcp").write_bytes((ckpt / "__0_0.distcp").read_bytes())
    _rewrite_storage(ckpt, "optimizer.step", relative_path="../outside.distcp")
    with pytest.raises(UnsafeCheckpointError, match=r"'optimizer.step' points outside the checkpoint"):
        vet_torch_dist_checkpoint(ckpt)
    ckpt = save(tmp_path / "b", state())
    _rewrite_storage(ckpt, "optimizer.step", transform_descriptors=["zstd"])
    with pytest.raises(UnsafeCheckpointError, match=r"stored with transforms \['zstd'\]"):
        vet_torch_dist_checkpoint(ckpt)


def test_damage_is_damage_not_a_refusal(tmp_path):
    """Bytes that do not deserialize at all are a damaged checkpoint (the trainer falls back)."""
    ckpt = save(tmp_path / "a", state())
    meta = pickle.loads((ckpt / ".metadata").read_bytes())
    info = next(i for idx, i in meta.storage_data.items() if idx.fqn == "optimizer.param_groups.0.lr")
    data = bytearray((ckpt / info.relative_path).read_bytes())
    data[info.offset : info.offset + info.length] = b"\x00" * info.length
    (ckpt / info.relative_path).write_bytes(bytes(data))
    with pytest.raises(DamagedCheckpointError, match=r"'optimizer.param_groups.0.lr' does not deserialize"):
        vet_torch_dist_checkpoint(ckpt)
    ckpt = save(tmp_path / "b", state())
    _rewrite_storage(ckpt, "args", length=10**9)
    with pytest.raises(DamagedCheckpointError, match=r"'args' lies past the end of"):
        vet_torch_dist_checkpoint(ckpt)
    ckpt = save(tmp_path / "c", state())
    (ckpt / ".metadata").write_bytes(pickle.dumps({"not": "metadata"}))
    with pytest.raises(DamagedCheckpointError, match=r"holds a dict"):
        vet_torch_dist_checkpoint(ckpt)
    (ckpt / ".metadata").unlink()
    with pytest.raises(DamagedCheckpointError, match=r"\.metadata does not deserialize"):
        vet_torch_dist_checkpoint(ckpt)


def test_tensor_storages_are_not_read(tmp_path, monkeypatch):
    """An object holding tensors (the distributed optimizer's param_state) is vetted on the meta
    device: its storages are not read (tens of GB at the 8B shape)."""
    # a tuple is one object to torch DCP (dicts and lists are flattened into their leaves)
    big = {"param_state": ({"exp_avg": torch.zeros(1 << 20), "exp_avg_sq": torch.zeros(1 << 20)},)}
    ckpt = save(tmp_path / "t", {"optimizer": big})
    from training import torch_dist_vetting

    reads = []
    real = torch_dist_vetting._Slice.readinto

    def counting(self, b):
        n = real(self, b)
        reads.append(n)
        return n

    monkeypatch.setattr(torch_dist_vetting._Slice, "readinto", counting)
    vet_torch_dist_checkpoint(ckpt)
    assert 0 < sum(reads) < 1 << 20, sum(reads)  # the two storages are 8 MiB
