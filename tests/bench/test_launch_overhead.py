"""bench/launch_overhead.py on a machine without a GPU: bad arguments and the missing GPU exit 2."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import launch_overhead as lo  # noqa: E402


def test_calls_below_one_is_refused(capsys):
    with pytest.raises(SystemExit) as err:
        lo.main(["--calls", "0"])
    assert err.value.code == 2 and "--calls must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_without_a_gpu_it_says_so(capsys, tmp_path):
    assert lo.main(["--out", str(tmp_path / "x")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written
