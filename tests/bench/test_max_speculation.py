"""bench/max_speculation.py's miss count on inputs whose answer is known: scores that grow with the
key index never move the running max after the diagonal tile (visited first); scores that shrink
with it move every row's max at every later tile."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from max_speculation import miss_rates  # noqa: E402


def _qk(growing: bool, s: int = 384, d: int = 16):
    q = torch.ones(1, 2, s, d)
    c = torch.linspace(0.1, 3.0, s) if growing else torch.linspace(3.0, 0.1, s)
    k = c.view(1, 1, s, 1).expand(1, 1, s, d).clone()
    return q, k


def test_no_miss_when_the_diagonal_holds_the_max():
    assert miss_rates(*_qk(True), threshold=0.0) == (0.0, 0.0)


def test_every_row_misses_when_earlier_keys_score_higher():
    warp, row = miss_rates(*_qk(False), threshold=0.5)
    assert warp == 1.0 and row == 1.0
