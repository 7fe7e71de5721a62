"""bench/attention_step_profile.py's host profile on a CPU: the functions a step calls, per step."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import attention_step_profile as asp  # noqa: E402


def _leaf():
    return sum(range(2000))


def _step():
    for _ in range(3):
        _leaf()


def test_host_profile_counts_calls_per_step_and_orders_by_own_time():
    rows = asp.host_profile(_step, steps=4)
    by_name = {r["function"].split("(")[-1].rstrip(")"): r for r in rows}
    assert by_name["_leaf"]["calls_per_step"] == 3 and by_name["_step"]["calls_per_step"] == 1
    assert by_name["_step"]["cum_ms_per_step"] >= by_name["_leaf"]["cum_ms_per_step"]  # all 3 calls
    owns = [r["own_ms_per_step"] for r in rows]
    assert owns == sorted(owns, reverse=True)


def test_backend_option_errors_exit_2_with_the_accepted_names(tmp_path, capsys):
    import pytest

    cases = [
        (["--backend", "triton", "--backend-option", "tiles=(128, 128, 2)"], "accepts ['block_m'"),
        (["--backend", "triton", "--backend-option", "block_m"], "expected NAME=VALUE"),
        (
            ["--backend", "triton", "--backend-option", "block_m=64", "--backend-option", "block_m=32"],
            "twice",
        ),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as err:
            asp.main([*argv, "--out", str(tmp_path / "p")])
        assert err.value.code == 2 and message in capsys.readouterr().err
