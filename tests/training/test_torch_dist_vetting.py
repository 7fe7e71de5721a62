"""training/torch_dist_vetting.py on torch_dist checkpoints written by torch DCP on the CPU.

megatron-core's ``dist_checkpointing.save`` needs CUDA, but its files are torch DCP's: a ``.metadata``
pickle and ``.distcp`` files holding tensors and the ``torch.save`` bytes of every object. The GPU
resume tests (``tests/training/test_train_gpu.py``, ``test_train_te_gpu.py``) run the vetting on
megatron-core's own checkpoints.
"""

from __future__ import annotations

import argparse
import io
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from training.checkpoint import DamagedCheckpointError, UnsafeCheckpointError
from training.distenv import free_local_port
from training.engine_megatron import dcp_tensor_shapes
from training.torch_dist_vetting import read_metadata, vet_torch_dist_checkpoint

# torch DCP gathers read errors into CheckpointException, a BaseException
LOAD_ERRORS = (Exception, CheckpointException)


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
    ckpt = save(tmp_path / "t", state())
    _rewrite_storage(ckpt, "w", relative_path="../outside.distcp")
    with pytest.raises(UnsafeCheckpointError, match=r"the tensor 'w' points outside the checkpoint"):
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


def _store_object(ckpt, key, blob):
    """Append ``blob`` to the checkpoint's data file and point object ``key`` of .metadata at it."""
    meta = pickle.loads((ckpt / ".metadata").read_bytes())
    with open(ckpt / "__0_0.distcp", "ab") as f:
        offset = f.tell()
        f.write(blob)
    for index, info in meta.storage_data.items():
        if index.fqn == key:
            info.offset, info.length = offset, len(blob)
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))


def test_a_refusal_is_not_disguised_as_damage(tmp_path):
    """Found in review: a payload whose pickle is broken after its GLOBAL (torch refuses at the
    GLOBAL, the pickle does not parse) and a TorchScript archive (which DCP's load_bytes hands to
    torch.jit.load) are refusals, not damage the trainer would fall back from."""
    import zipfile

    src, out = io.BytesIO(), io.BytesIO()
    torch.save(Payload(tmp_path / "ran"), src)
    src.seek(0)
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zo:
        for name in zi.namelist():
            data = zi.read(name)
            zo.writestr(name, data[:-1] + b"\xff" if name.endswith("data.pkl") else data)
    ckpt = save(tmp_path / "a", state())
    _store_object(ckpt, "optimizer.step", out.getvalue())
    with pytest.raises(UnsafeCheckpointError, match=r"'optimizer.step' is not data: .*GLOBAL posix.system"):
        vet_torch_dist_checkpoint(ckpt)

    class M(torch.nn.Module):
        def forward(self, x):
            return x

    script = io.BytesIO()
    torch.jit.save(torch.jit.script(M()), script)
    ckpt = save(tmp_path / "b", state())
    _store_object(ckpt, "optimizer.step", script.getvalue())
    with pytest.raises(UnsafeCheckpointError, match=r"'optimizer.step' is not data: .*TorchScript"):
        vet_torch_dist_checkpoint(ckpt)
    _rewrite_storage(ckpt, "optimizer.step", offset="0")
    with pytest.raises(DamagedCheckpointError, match=r"malformed storage entry"):
        vet_torch_dist_checkpoint(ckpt)
    assert not (tmp_path / "ran").exists()


def test_the_load_itself_reads_as_data(tmp_path):
    """Inside data_only_torch_load, torch DCP's load (what megatron-core's dist_checkpointing.load
    runs) refuses a code payload in an object, and megatron-core's load_common_state_dict refuses one
    in the per-rank __0.metadata that DCP falls back to when .metadata fails to load (found in review:
    a .metadata the vetting accepts, whose storage_meta is not a StorageMeta, made DCP read it)."""
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict

    from training.torch_dist_vetting import data_only_torch_load, refused_pickle

    marker = tmp_path / "ran"
    bad = state()
    bad["optimizer"]["step"] = Payload(marker)
    ckpt = save(tmp_path / "a", bad)
    with data_only_torch_load(), pytest.raises(LOAD_ERRORS) as info:
        dcp.load({"optimizer": {"step": None}}, checkpoint_id=str(ckpt), no_dist=True)
    assert refused_pickle(info.value) and not marker.exists()
    import torch.distributed.checkpoint.filesystem as dcp_fs

    assert torch.load is torch.serialization.load and dcp_fs.pickle is pickle  # restored

    ckpt = save(tmp_path / "b", state())
    (ckpt / "metadata.json").write_text(
        '{"sharded_backend": "torch_dist", "sharded_backend_version": 1, '
        '"common_backend": "torch", "common_backend_version": 1}'
    )
    meta = pickle.loads((ckpt / ".metadata").read_bytes())
    meta.storage_meta = 1
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    (ckpt / "__0.metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UnsafeCheckpointError, match=r"per-rank metadata files \['__0.metadata'\]"):
        vet_torch_dist_checkpoint(ckpt)
    (ckpt / "__0.metadata").rename(ckpt / "saved")
    with pytest.raises(DamagedCheckpointError, match=r"malformed fields: dict, dict, int"):
        vet_torch_dist_checkpoint(ckpt)
    (ckpt / "saved").rename(ckpt / "__0.metadata")
    with data_only_torch_load(), pytest.raises(LOAD_ERRORS):  # DCP drops the refusal: "metadata is None"
        load_common_state_dict(str(ckpt))
    assert not marker.exists()
    with pytest.raises(LOAD_ERRORS):  # what the context stands in front of
        load_common_state_dict(str(ckpt))
    assert marker.exists()


def test_megatron_cores_own_checkpoint_is_vetted_and_loads(tmp_path):
    """megatron-core's writer (TorchDistSaveShardedStrategy: what the GPU engine saves with) on the
    CPU: the vetting accepts its .metadata and objects (a TE extra state, optimizer param groups, a
    dp_reshardable-style param_state keyed by dtypes, a Namespace in the common state), and
    dist_checkpointing.load inside data_only_torch_load gives back what was saved."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("megatron_torch_dist_cpu.py")
    out = tmp_path / "ckpt"
    out.mkdir()
    env = {**os.environ, "PORT": str(free_local_port())}  # the suite runs in parallel processes (-n)
    res = subprocess.run(
        [sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=300, env=env
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"files": [".metadata", "__0_0.distcp", "metadata.json"], "same": True}
