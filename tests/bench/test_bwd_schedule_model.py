"""bench/bwd_schedule_model.py: the greedy list-scheduling model of the backward's CTA orders."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bwd_schedule_model import makespan, model, orders  # noqa: E402


def test_makespan_is_greedy_list_scheduling():
    assert makespan([3, 3, 2], 2) == 5  # the third job starts when the first SM frees
    assert makespan([1] * 8, 4) == 2
    assert makespan([4, 1, 1, 1, 1], 2) == 4  # heaviest first: the others fit beside it


def test_orders_hold_the_same_work():
    o = orders(2, 8, 2, 4, 0.0)
    assert sorted(o["default"]) == sorted(o["lpt"]) == sorted(o["l2_sections"])
    assert sum(o["head_loop"]) == sum(o["default"])  # 4 query heads per CTA, a quarter of the CTAs
    assert len(o["head_loop"]) * 4 == len(o["default"])
    assert o["lpt"][0] == max(o["lpt"]) and o["head_loop"][0] == max(o["head_loop"])


def test_heaviest_first_balances_better_at_b1():
    (row,) = [r for r in model(132, 4096, [0.0]) if r["B"] == 1]
    assert row["lpt"] < row["default"] and row["head_loop"] < row["default"]
    assert row["lpt"] >= 1.0 and row["head_loop"] >= 1.0
    assert 1.0 <= row["l2_sections"] < row["default"]


def test_l2_sections_take_8_heads_heaviest_first():
    """Sections of 8 (batch, head) pairs: the first 8 CTAs are the first KV block of heads 0-7."""
    o = orders(1, 32, 8, 4, 0.0)
    assert o["l2_sections"][:8] == [max(o["default"])] * 8
    assert o["l2_sections"][8] < o["l2_sections"][0]
