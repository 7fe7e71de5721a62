"""Reading a training run directory as ``training/metrics.py`` writes it.

``metrics.jsonl`` holds one JSON object per line (``kind``: train, valid, telemetry or event),
appended across launches and resumes: a step can appear more than once (readers keep the last record
of a kind and step, and a ``resume`` event at step k supersedes the records of later steps before it,
a fresh ``start`` all of them: :mod:`training.records`) and a killed run can leave a torn last line
(the trainer removes it before the next launch appends).
``run_meta.json`` holds one JSON object (fingerprints, seed, world size, commit, precision, the
resolved config, the prepared files' digest ``data_content``).

The files are untrusted data: nothing in them is executed or used as a path. This module only
parses them; what the fields must be is left to the callers: ``tools/runcompare/runs.py`` checks
every field it uses and refuses a bad line, ``tools/multigpu/`` reads leniently (a damaged run is a
failed check, not a crash).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
META_FILE = "run_meta.json"


def metrics_lines(run_dir: Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """Parse ``run_dir/metrics.jsonl`` line by line.

    Yields ``(line number, record, None)`` for a line holding a JSON object and ``(line number, None,
    problem)`` for any other non-blank line (``not valid UTF-8``, ``not valid JSON (...)``, ``not a
    JSON object``).

    Raises:
        OSError: the file cannot be opened or read (FileNotFoundError: there is none).
    """
    with (run_dir / METRICS_FILE).open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield lineno, None, "not valid UTF-8"
                continue
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                yield lineno, None, f"not valid JSON ({e.msg})"
                continue
            if isinstance(rec, dict):
                yield lineno, rec, None
            else:
                yield lineno, None, "not a JSON object"


def read_records(run_dir: Path) -> list[dict]:
    """Every record of ``run_dir/metrics.jsonl`` in file order, repeated steps included; lines that are
    not a JSON object (a torn last line) are skipped. ``[]`` when the file does not exist."""
    if not (run_dir / METRICS_FILE).is_file():
        return []
    return [rec for _, rec, _ in metrics_lines(run_dir) if rec is not None]


def parse_meta(run_dir: Path):
    """``run_dir/run_meta.json`` parsed (any JSON value: the caller checks it is an object).

    Raises:
        OSError: the file cannot be read (FileNotFoundError: there is none).
        ValueError: not JSON (json.JSONDecodeError) or not UTF-8 (UnicodeDecodeError).
    """
    return json.loads((run_dir / META_FILE).read_text(encoding="utf-8"))


def meta_value(run_dir: Path, get: Callable, default=None):
    """``get(meta)`` of the run's ``run_meta.json``, or ``default`` when the file is missing or
    unreadable or lacks what ``get`` reads."""
    try:
        return get(parse_meta(run_dir))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
        return default
