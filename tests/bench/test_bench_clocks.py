"""``bench/bench_clocks.py`` on written logs: rows with their own ``t_unix`` windows and older rows
with (shape, pass) group windows from the printed-at prefix, idle samples left out, the software
power cap counted from its bit, a cut last sample line skipped, and a missing file refused."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_clocks as bc  # noqa: E402

T0 = 1_796_486_000  # a Unix second


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def _write(tmp: Path, rows: list[tuple[int, dict]], samples: list[tuple[float, int, float, str]]) -> Path:
    (tmp / "bench.log").write_text(
        "gpu name line\n" + "".join(f"{t} {json.dumps(r)}\n" for t, r in rows) + "| md | table |\n"
    )
    head = (
        "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu, "
    )
    lines = [head + "clocks_event_reasons.active"]
    lines += [f"{_stamp(t)}, {mhz} MHz, 2619 MHz, {w:.2f} W, 50, {reasons}" for t, mhz, w, reasons in samples]
    (tmp / "bench_clocks.csv").write_text("\n".join(lines) + "\n2026/12/05 16:0")  # a cut last line
    return tmp


def _samples():
    out = [(T0 + 0.1, 345, 70.0, "0x0000000000000001")]  # idle: left out
    out += [(T0 + 1 + i / 5, 1980, 500.0, "0x0000000000000000") for i in range(5)]  # [T0 + 1, T0 + 2)
    out += [(T0 + 2 + i / 5, 1500, 700.0, "0x0000000000000004") for i in range(4)]
    out += [(T0 + 2.8, 1900, 690.0, "0x0000000000000000")]
    return out


def test_row_windows_from_t_unix(tmp_path):
    rows = [
        (T0 + 3, {"shape": "S", "pass": "fwd", "impl": "a", "ms": 1.0, "t_unix": [T0 + 1.0, T0 + 2.0]}),
        (T0 + 3, {"shape": "S", "pass": "fwd", "impl": "b", "ms": 1.0, "t_unix": [T0 + 2.0, T0 + 3.0]}),
        (T0 + 3, {"shape": "S", "pass": "fwd", "impl": "c", "error": "RuntimeError: no"}),
    ]
    out = bc.report(_write(tmp_path, rows, _samples()))
    assert [w["window"] for w in out] == ["S fwd a", "S fwd b"]
    a, b = out
    assert (a["samples"], a["sm_mhz_median"], a["sw_power_cap_fraction"]) == (5, 1980, 0.0)
    assert (b["samples"], b["sm_mhz_min"], b["watts_max"], b["sw_power_cap_fraction"]) == (
        5,
        1500,
        700.0,
        0.8,
    )
    assert "| S fwd b | 1.000 | 5 | 1500 | 1500 | 700 | 50 | 0.80 |" in bc.to_markdown(out)


def test_one_window_per_round(tmp_path):
    spans = [[T0 + 1.0, T0 + 2.0], [T0 + 2.0, T0 + 3.0]]  # attention_bench --rounds 2
    row = {"shape": "S", "pass": "fwd", "impl": "a", "ms": 1.5, "ms_rounds": [1.0, 2.0], "t_unix": spans}
    out = bc.report(_write(tmp_path, [(T0 + 3, row)], _samples()))
    assert [w["window"] for w in out] == ["S fwd a #0", "S fwd a #1"]
    assert [w["ms"] for w in out] == [1.0, 2.0]
    assert [w["sw_power_cap_fraction"] for w in out] == [0.0, 0.8]


def test_group_windows_without_t_unix(tmp_path):
    rows = [
        (T0 + 1, {"shape": "S", "pass": "fwd", "impl": "a", "ms": 1.0}),  # the first group: start unknown
        (T0 + 2, {"shape": "S", "pass": "bwd", "impl": "a", "ms": 1.0}),
        (T0 + 2, {"shape": "S", "pass": "bwd", "impl": "b", "ms": 1.0}),
    ]
    out = bc.report(_write(tmp_path, rows, _samples()))
    assert len(out) == 1 and out[0]["window"] == "S bwd" and out[0]["rows"] == ["a", "b"]
    assert out[0]["ms"] is None
    # the window runs from the previous print (T0 + 1) to the end of its own print's second (T0 + 3)
    assert out[0]["samples"] == 10 and out[0]["sw_power_cap_fraction"] == 0.4


def test_missing_file_is_refused(tmp_path, capsys):
    (tmp_path / "bench.log").write_text("")
    assert bc.main([str(tmp_path)]) == 2
    assert "bench_clocks.csv not found" in capsys.readouterr().err
