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
def test_bad_shape_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        asp.main(["--shape", bad, "--out", "/tmp/unused"])
    assert exc.value.code == 2 and "--shape must be B,Hq,Hkv,S" in capsys.readouterr().err


def test_unknown_backend_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        asp.main(["--backend", "nope", "--out", "/tmp/unused"])
    assert exc.value.code == 2 and "--backend 'nope' is not a backend" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
def test_without_a_gpu_exit_2_and_one_sentence(capsys):
    assert asp.main(["--out", "/tmp/unused"]) == 2
    assert (
        capsys.readouterr().err.strip() == "attention_step_profile: needs a CUDA GPU; this machine has none"
    )
