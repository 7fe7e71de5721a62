"""Write a torch_dist checkpoint with megatron-core's own writer on the CPU, vet it, load it back.

Run by ``test_torch_dist_vetting.py`` in a subprocess: ``python megatron_torch_dist_cpu.py DIR``.
megatron-core's ``dist_checkpointing.save`` calls CUDA in three places that do nothing here
(``torch.cuda.synchronize``, ``torch.cuda.current_device`` for a flag tensor, the writer's memory
probe through psutil), stubbed for this process only; the files are what it writes on a GPU. Prints
one JSON line: the checkpoint's files and whether the loaded values equal the saved ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(out: Path) -> None:
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    import megatron.core.dist_checkpointing.strategies.filesystem_async as fs_async

    fs_async._process_memory = lambda: 0
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29561"))
    dist.init_process_group("gloo", rank=0, world_size=1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    from training.torch_dist_vetting import data_only_torch_load, vet_torch_dist_checkpoint

    groups = [{"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "params": [0, 1]}]
    extra = torch.frombuffer(bytearray(b"\x80\x04N."), dtype=torch.uint8)  # a TE extra state: pickle bytes
    param_state = {
        0: {(torch.bfloat16, torch.float32): [{"param": torch.ones(4), "exp_avg": torch.zeros(4)}]}
    }

    def sharded():
        return {
            "model": {
                "w": ShardedTensor.from_rank_offsets("decoder.w", torch.arange(8.0).view(2, 4)),
                "x": ShardedObject("decoder.layers.0._extra_state", extra.clone(), (1,), (0,)),
            },
            "optimizer": {
                "param_groups": ShardedObject("optimizer.param_groups", groups, (1,), (0,)),
                "param_state": ShardedObject("optimizer.param_state", param_state, (1, 1), (0, 0)),
                "sharding_type": "dp_reshardable",
                "args": argparse.Namespace(seq_length=4096),
            },
        }

    dist_checkpointing.save(sharded(), str(out), sharded_strategy=TorchDistSaveShardedStrategy())
    vet_torch_dist_checkpoint(out)
    with data_only_torch_load():
        state = dist_checkpointing.load(sharded(), str(out))
    opt = state["optimizer"]
    same = (
        torch.equal(state["model"]["w"], torch.arange(8.0).view(2, 4))
        and torch.equal(state["model"]["x"], extra)
        and opt["param_groups"] == groups
        and torch.equal(opt["param_state"][0][(torch.bfloat16, torch.float32)][0]["param"], torch.ones(4))
        and opt["sharding_type"] == "dp_reshardable"
        and opt["args"].seq_length == 4096
    )
    print(json.dumps({"files": sorted(p.name for p in out.iterdir()), "same": bool(same)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
