"""bench/graph_eager_mix.py on the CPU: its cases, the record made from a child's output (the first
stage not reported is the failed one), a child's stages with stand-in steps, and its argument checks."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import graph_eager_mix as gem  # noqa: E402

ab = gem.ab


def test_cases_pair_each_step_with_its_own_graph_and_cudnn_after_the_others():
    assert gem.cases(("cudnn_bf16", "fa4_bf16", "cute_fp8")) == [
        ("cudnn_bf16", "cudnn_bf16"),
        ("fa4_bf16", "fa4_bf16"),
        ("cute_fp8", "cute_fp8"),
        ("fa4_bf16", "cudnn_bf16"),
        ("cute_fp8", "cudnn_bf16"),
        ("all", "all"),
    ]
    assert gem.cases(("fa4_bf16",)) == [("fa4_bf16", "fa4_bf16"), ("all", "all")]


def test_summarize_names_the_first_stage_not_reported():
    ok = gem.summarize("a", "b", "".join(f"stage {s}\n" for s in gem.STAGES), "", 0)
    assert ok["ok"] and "failed_stage" not in ok and ok["stages"] == list(gem.STAGES)
    out = "stage eager_before\nstage capture\neager cudnn_bf16 ok\n"
    err = "Traceback ...\ntorch.AcceleratorError: CUDA error: an illegal memory access was encountered\n\n"
    bad = gem.summarize("all", "all", out, err, 1)
    assert not bad["ok"] and bad["failed_stage"] == "eager_after" and bad["eager_ok"] == ["cudnn_bf16"]
    assert bad["error"].startswith("torch.AcceleratorError") and bad["rc"] == 1
    # a child killed after every stage printed is still not ok
    killed = gem.summarize("a", "a", "".join(f"stage {s}\n" for s in gem.STAGES), "", -11)
    assert not killed["ok"] and killed["failed_stage"] is None


def _fake_steps(monkeypatch, log):
    def steps(names, shape, causal):
        def make(name):
            def build():
                log.append(("build", name))
                return lambda: log.append(("run", name))

            return build

        return {n: make(n) for n in names}

    monkeypatch.setattr(gem, "_steps", steps)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(ab, "graphed", lambda fn: lambda: (log.append(("replay", None)), fn()))


def test_child_runs_the_stages_in_order(monkeypatch, capsys):
    log = []
    _fake_steps(monkeypatch, log)
    gem.child("fa4_bf16", "cudnn_bf16", (1, 2, 1, 8), True, 2, gem.IMPLS)
    stages = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("stage ")]
    assert stages == [f"stage {s}" for s in gem.STAGES]
    assert log[:3] == [("build", "cudnn_bf16"), ("run", "cudnn_bf16"), ("build", "fa4_bf16")]
    after = [("run", "cudnn_bf16")] * 2 + [("replay", None), ("run", "fa4_bf16"), ("run", "cudnn_bf16")]
    assert log[3:] == after


def test_child_all_is_the_benchmark_group_in_its_order(monkeypatch, capsys):
    log = []
    _fake_steps(monkeypatch, log)
    gem.child("all", "all", (1, 2, 1, 8), True, 1, gem.IMPLS, ("fa2_bf16",))
    out = capsys.readouterr().out.splitlines()
    eager = ["cudnn_bf16", "fa2_bf16", "ours_fp8", "fa4_bf16", "cute_fp8"]
    assert [ln.split()[1] for ln in out if ln.startswith("eager ")] == eager
    builds = [n for kind, n in log if kind == "build"]
    assert builds == eager + ["cudnn_bf16", "ours_fp8", "fa4_bf16", "cute_fp8"]  # then the graphs


def test_bad_shape_is_refused():
    with pytest.raises(SystemExit) as e:
        gem.main(["--shape", "1,32,8"])
    assert e.value.code == 2
