"""Seed spread within one arm: how far runs that differ only in their seed lie apart, per token window.

The noise floor of a precision comparison: a gap between arms smaller than the spread of one arm's
seeds cannot be told from seed noise. Per window, each run's mean loss over the points finite in
every run of the arm (paired, as for the gaps); the spread is the sample standard deviation
(``ddof=1``) and the range (max - min) of those per-seed means. Units: nats.
"""

from __future__ import annotations

import numpy as np


def _seed_means(m: np.ndarray) -> tuple[np.ndarray, int]:
    """Per-run means over the columns finite in every run of ``m`` (runs, points); and their count."""
    keep = np.isfinite(m).all(axis=0)
    if not keep.any():
        return np.full(m.shape[0], np.nan), 0
    return m[:, keep].mean(axis=1), int(keep.sum())


def spread_row(m: np.ndarray) -> dict:
    """The spread of the runs of ``m`` (runs, points; NaN = non-finite): ``mean`` (over seeds of the
    per-seed means), ``sd`` (ddof=1), ``range`` (max - min), ``per_seed`` (list), ``n_points``;
    values None when no point is finite in every run."""
    means, n = _seed_means(m)
    if n == 0:
        return {"mean": None, "sd": None, "range": None, "per_seed": [None] * m.shape[0], "n_points": 0}
    return {
        "mean": float(means.mean()),
        "sd": float(means.std(ddof=1)),
        "range": float(means.max() - means.min()),
        "per_seed": [float(x) for x in means],
        "n_points": n,
    }


def seed_spread(names: list[str], series: dict[str, np.ndarray], widx: np.ndarray, n_win: int) -> list[dict]:
    """Per window ``w`` of ``n_win`` (``widx``: window index of each point), the :func:`spread_row` of
    the runs ``names`` (>= 2) of ``series`` (run name -> losses on the aligned grid), with ``window``."""
    out = []
    for w in range(n_win):
        sel = widx == w
        m = np.stack([np.asarray(series[n], dtype=np.float64)[sel] for n in names])
        m[~np.isfinite(m)] = np.nan
        out.append({"window": w, **spread_row(m)})
    return out
