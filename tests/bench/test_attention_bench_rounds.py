"""bench/attention_bench.py's ``time_rows`` on the CPU with a stand-in for its GPU timer: one round
times each row once, in order, and drops its callable before the next is built; more rounds build
every callable first, time them round-robin and report the median; a row whose build raises is
reported with its error and the others are still timed; ``graphed``'s replay keeps its step alive."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import attention_bench as ab  # noqa: E402

META = {"shape": "B1 H2/1 S8", "B": 1, "Hq": 2, "Hkv": 1, "S": 8, "D": 128, "causal": True, "pass": "fwd"}


def _run(monkeypatch, rounds):
    events, times = [], iter([3.0, 1.0, 5.0, 2.0, 4.0, 6.0, 7.0, 8.0, 9.0])

    def fake_bench(fn):
        events.append(("time", fn()))
        return next(times)

    monkeypatch.setattr(ab, "bench", fake_bench)

    def make(name):
        def build():
            events.append(("build", name))
            if name == "broken":
                raise RuntimeError("no kernel")
            return lambda: name

        return build

    cands = [(n, make(n)) for n in ("a", "broken", "b")]
    return ab.time_rows(cands, META, rounds), events


def test_one_round_times_each_row_once_in_turn(monkeypatch):
    recs, events = _run(monkeypatch, 1)
    assert events == [("build", "a"), ("time", "a"), ("build", "broken"), ("build", "b"), ("time", "b")]
    a, broken, b = recs
    assert (a["impl"], a["ms"], b["ms"]) == ("a", 3.0, 1.0) and a["pass"] == "fwd"
    assert "ms_rounds" not in a and len(a["t_unix"]) == 2 and a["t_unix"][0] <= a["t_unix"][1]
    assert "no kernel" in broken["error"] and "ms" not in broken


def test_rounds_build_first_then_time_round_robin(monkeypatch):
    recs, events = _run(monkeypatch, 3)
    assert [e for e in events if e[0] == "build"] == [("build", "a"), ("build", "broken"), ("build", "b")]
    assert [e[1] for e in events if e[0] == "time"] == ["a", "b"] * 3
    a, _, b = recs
    assert a["ms_rounds"] == [3.0, 5.0, 4.0] and a["ms"] == 4.0  # the median of the rounds
    assert b["ms_rounds"] == [1.0, 2.0, 6.0] and b["ms"] == 2.0
    assert len(a["t_unix"]) == 3 and all(len(w) == 2 for w in a["t_unix"])


def test_graphed_replay_keeps_the_step_and_its_tensors_alive(monkeypatch):
    """The fault of --graphed --rounds N (results/session_2026-12-05g_h100): a graph's step (and so
    its dO and gradient leaves, outside the graph's pool) died when graphed() returned, and the next
    capture's empty_cache released that memory under the first graph. The replay must hold the step."""
    import contextlib
    import gc
    import weakref

    events = []

    class Graph:
        def replay(self):
            events.append("replay")

    class Stream:
        def wait_stream(self, other):
            pass

    cuda = torch.cuda
    monkeypatch.setattr(cuda, "Stream", Stream)
    monkeypatch.setattr(cuda, "current_stream", Stream)
    monkeypatch.setattr(cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(cuda, "graph", lambda g: contextlib.nullcontext())

    class Step:  # stands for the closure that owns dO and the leaves
        def __call__(self):
            events.append("step")

    step = Step()
    alive = weakref.ref(step)
    replay = ab.graphed(step, warmup=2)
    del step
    gc.collect()
    assert alive() is not None, "the replay dropped the step: its tensors would be freed under the graph"
    replay()
    assert events == ["step"] * 3 + ["replay"]  # two warm-up calls, the captured one, then the replay
    del replay
    gc.collect()
    assert alive() is None
