"""bench/host_stages.py on a machine without a GPU: its timers (inclusive time summed per step,
functions and static methods put back afterwards), its stage list (every wrapped name exists), bad
arguments and the missing GPU (exit 2)."""

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import host_stages as hs  # noqa: E402


class Clock:
    """A fake ``time.perf_counter_ns``: the timings are exact, whatever the machine's load (a 2 ms
    sleep once took 5.4 ms on a loaded CI runner and failed the ordering check)."""

    now = 0

    @classmethod
    def ns(cls):
        return cls.now


class Owner:
    @staticmethod
    def slow(x):
        Clock.now += 2_000_000 + x  # 2 ms and a little, per call
        return x + 1


def test_timers_sum_per_step_and_put_the_function_back(monkeypatch):
    monkeypatch.setattr(hs.time, "perf_counter_ns", Clock.ns)
    t = hs.Timers()
    original = Owner.__dict__["slow"]
    undo = t.wrap(Owner, "slow", "label")
    for step in (0, 0, 1):
        t.step = step
        assert Owner.slow(1) == 2
    undo()
    assert Owner.__dict__["slow"] is original
    ns = t.ns["label"]
    assert dict(ns) == {0: 2 * 2_000_001, 1: 2_000_001}  # two calls in step 0, one in step 1
    medians = t.medians_us([0, 1, 2])  # step 2 had no call: 0
    assert medians["label"] == pytest.approx(2_000_001 / 1e3)


@pytest.mark.parametrize("backend", ["cute", "fa4"])
def test_every_stage_exists_and_unwraps(backend):
    pytest.importorskip("cutlass")  # the stages live in the cute and fa4 backends' modules
    pytest.importorskip("flash_attn.cute")
    t = hs.Timers()
    stages = hs.stages(backend)
    before = [
        (owner, name, (owner.__dict__ if isinstance(owner, type) else vars(owner))[name])
        for owner, name, _ in stages
    ]
    undo = [t.wrap(owner, name, label) for owner, name, label in stages]
    for u in reversed(undo):
        u()
    for owner, name, fn in before:
        assert (owner.__dict__ if isinstance(owner, type) else vars(owner))[name] is fn


@pytest.mark.parametrize("argv", [["--shape", "1,2,3"], ["--shape", "1,3,2,128"], ["--steps", "0"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as err:
        hs.main(argv)
    assert err.value.code == 2 and "--shape needs four positive ints" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_without_a_gpu_it_says_so(capsys, tmp_path):
    assert hs.main(["--out", str(tmp_path / "x")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_set_env_puts_back_a_value_or_its_absence(monkeypatch):
    monkeypatch.setenv("FP4_TEST_VAR", "7")
    hs.set_env("FP4_TEST_VAR", None)
    assert "FP4_TEST_VAR" not in os.environ
    hs.set_env("FP4_TEST_VAR", "0")
    assert os.environ["FP4_TEST_VAR"] == "0"
