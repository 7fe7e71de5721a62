"""tools/fidelity_diff.py on the committed CPU tables of results/exp_f16_numerics_cpu: the largest
cosine change per recipe and tensor, and bad inputs (exit 2)."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import fidelity_diff as fd  # noqa: E402

DIR = ROOT / "results" / "exp_f16_numerics_cpu"


def _load(name):
    return json.loads((DIR / f"{name}.json").read_text())


def test_largest_change_per_recipe_and_tensor():
    base, other = _load("fidelity_recipe"), _load("fidelity_p_fp16")
    rows = fd.diff(base, other)
    assert {(r["recipe"], r["tensor"]) for r in rows} == {
        (r, t) for r in ("fp8", "nvfp4qk_fp8pv") for t in ("out", "dq", "dk", "dv")
    }
    # brute force over the same cells
    cells = {(r["family"], r["recipe"]): r for r in base["records"]}
    for row in rows:
        deltas = [
            o[row["tensor"]][0] - cells[(o["family"], o["recipe"])][row["tensor"]][0]
            for o in other["records"]
            if o["recipe"] == row["recipe"]
        ]
        assert abs(row["delta"]) == max(abs(d) for d in deltas)
        assert row["other"] - row["base"] == row["delta"]
    # the README's figure: the forward's p_fp16 moves no cosine by more than 1.7e-4
    assert max(abs(r["delta"]) for r in rows) < 1.7e-4


def test_no_shared_rows_and_missing_files_exit_2(tmp_path, capsys):
    other = _load("fidelity_p_fp16")
    for r in other["records"]:
        r["family"] = "x" + r["family"]
    (tmp_path / "o.json").write_text(json.dumps(other))
    assert fd.main([str(DIR / "fidelity_recipe.json"), str(tmp_path / "o.json")]) == 2
    assert "share no" in capsys.readouterr().err
    assert fd.main([str(DIR / "fidelity_recipe.json"), str(tmp_path / "none.json")]) == 2


def test_writes_markdown_and_json(tmp_path):
    out = tmp_path / "d"
    assert (
        fd.main([str(DIR / "fidelity_recipe.json"), str(DIR / "fidelity_p_fp16.json"), "--out", str(out)])
        == 0
    )
    assert "| fp8 | dk |" in (tmp_path / "d.md").read_text()
    assert len(json.loads((tmp_path / "d.json").read_text())["rows"]) == 8
