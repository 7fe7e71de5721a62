"""bench/attention_step_profile.py on the CPU: the per-kernel table and the argument checks (the
profile itself needs a GPU)."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import attention_step_profile as asp  # noqa: E402

CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def ev(name, us, device=CUDA):
    return SimpleNamespace(name=name, device_time=us, device_type=device)


def test_kernel_table_sums_per_name_per_step_and_skips_host_events():
    events = [
        ev("quant", 100.0),
        ev("bwd", 2000.0),
        ev("quant", 300.0),
        ev("bwd", 2200.0),
        ev("aten::mm", 9e9, CPU),
    ]
    rows = asp.kernel_table(events, steps=2)
    assert rows == [
        {"kernel": "bwd", "ms_per_step": pytest.approx(2.1), "launches_per_step": 1.0},
        {"kernel": "quant", "ms_per_step": pytest.approx(0.2), "launches_per_step": 1.0},
    ]


@pytest.mark.parametrize("bad", ["4,32,8", "4,32,8,x", "0,32,8,4096"])
def test_bad_shape_is_one_sentence(bad):
    with pytest.raises(SystemExit, match="--shape must be B,Hq,Hkv,S"):
        asp.main(["--shape", bad, "--out", "/tmp/unused"])
