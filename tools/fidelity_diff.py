"""How far one ``tools/fidelity.py`` table moves from another: per recipe and tensor, the largest
change of the cosine against float64 (and the family where it happens), over the rows both tables
hold. For a numerics option measured against its recipe: the two runs must share their inputs
(the same command but for ``--backend-option``; each JSON records its command).

    python tools/fidelity_diff.py BASE.json OTHER.json [--out PREFIX]

Prints, and writes to ``PREFIX.{md,json}``: one row per (recipe, tensor) with the largest
``cos(OTHER) - cos(BASE)`` in absolute value, signed, and the family; and the two commands.
Exit status 2 for files that cannot be read or that share no row.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TENSORS = ("out", "dq", "dk", "dv")


def _rows(doc: dict) -> dict:
    return {(r["family"], r["recipe"]): r for r in doc["records"]}


def diff(base: dict, other: dict) -> list[dict]:
    """``[{recipe, tensor, delta, family, base, other}]``: per recipe and tensor the largest
    ``|cos_other - cos_base|`` (``delta`` signed) over the (family, recipe) rows of both tables.

    Raises:
        ValueError: the tables share no (family, recipe) row.
    """
    a, b = _rows(base), _rows(other)
    shared = [k for k in a if k in b]
    if not shared:
        raise ValueError("fidelity_diff: the two tables share no (family, recipe) row")
    worst: dict = {}
    for family, recipe in shared:
        for t in TENSORS:
            if t not in a[(family, recipe)] or t not in b[(family, recipe)]:
                continue
            x, y = a[(family, recipe)][t][0], b[(family, recipe)][t][0]
            key = (recipe, t)
            if key not in worst or abs(y - x) > abs(worst[key]["delta"]):
                worst[key] = {
                    "recipe": recipe,
                    "tensor": t,
                    "delta": y - x,
                    "family": family,
                    "base": x,
                    "other": y,
                }
    recipes = list(dict.fromkeys(r for _, r in shared))
    return [worst[(r, t)] for r in recipes for t in TENSORS if (r, t) in worst]


def to_markdown(rows: list[dict], base: dict, other: dict, paths: tuple[str, str]) -> str:
    lines = [
        "# Cosine changes between two fidelity tables",
        "",
        f"- base `{paths[0]}`: `{base.get('command', '?')}`",
        f"- other `{paths[1]}`: `{other.get('command', '?')}`",
        "",
        "| recipe | tensor | largest change of cosine | family | base | other |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['recipe']} | {r['tensor']} | {r['delta']:+.2e} | {r['family']} "
        f"| {r['base']:.5f} | {r['other']:.5f} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="fidelity.py JSON")
    p.add_argument("other", help="fidelity.py JSON of the same inputs")
    p.add_argument("--out", default=None, help="output prefix (PREFIX.md, PREFIX.json)")
    a = p.parse_args(argv)
    try:
        base, other = (json.loads(Path(f).read_text()) for f in (a.base, a.other))
        rows = diff(base, other)
    except (OSError, ValueError, KeyError) as err:
        print(f"fidelity_diff: {err}", file=sys.stderr)
        return 2
    md = to_markdown(rows, base, other, (a.base, a.other))
    print(md)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{a.out}.md").write_text(md)
        Path(f"{a.out}.json").write_text(
            json.dumps({"base": a.base, "other": a.other, "rows": rows}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
