"""t intervals for the difference of two arms' means over their seeds (Welch's, and the paired one),
and the Student t quantiles they need (no SciPy: the regularized incomplete beta by its continued
fraction).

Used for the final validation gap between an arm and the baseline: each seed contributes one number
(its last validation loss, nats). Where the arms hold different seeds, the seeds of an arm are
independent draws and Welch's interval is

    gap +- t_{1 - alpha/2, df} * sqrt(s_a^2 / n_a + s_b^2 / n_b)

with the Welch-Satterthwaite ``df`` (variances not assumed equal). Where both arms hold the same
seeds (the README's design: one run per recipe and seed, same data), the runs of a seed are a pair
(same initial weights and data) and the interval is the paired one over the per-seed differences
``d_s = a_s - b_s``:

    mean(d) +- t_{1 - alpha/2, n - 1} * s_d / sqrt(n)

which is valid whatever the correlation within the pairs (Welch's is too wide where it is positive,
too narrow where it is negative). The half-width is the smallest gap the design resolves: a true gap
smaller than it is not told from seed noise (the interval then covers 0), whatever the point
estimate.
"""

from __future__ import annotations

import math

import numpy as np

METHOD = "Welch t interval over seeds (Welch-Satterthwaite degrees of freedom)"
PAIRED_METHOD = "paired t interval over the seeds' differences (n - 1 degrees of freedom)"


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta (modified Lentz), as in Numerical Recipes' betacf."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        even = m * (b - m) * x / ((qam + m2) * (a + m2))
        odd = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        for num in (even, odd):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``."""
    if not (a > 0 and b > 0 and 0.0 <= x <= 1.0):
        raise ValueError(f"betainc needs a, b > 0 and 0 <= x <= 1, got a={a}, b={b}, x={x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """``P(T > t)`` for Student's t with ``df > 0`` degrees of freedom (``df`` need not be an integer)."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (bisection, 1e-12 relative)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"the quantile level must be in (0, 1), got {q}")
    if q < 0.5:
        return -t_ppf(1.0 - q, df)
    if q == 0.5:
        return 0.0
    upper = 1.0 - q
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > upper:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_sf(mid, df) > upper:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def welch_df(var_a: float, n_a: int, var_b: float, n_b: int) -> float | None:
    """Welch-Satterthwaite degrees of freedom; None when both variances are 0 (no seed spread)."""
    ua, ub = var_a / n_a, var_b / n_b
    den = ua * ua / (n_a - 1) + ub * ub / (n_b - 1)
    return None if den == 0.0 else float((ua + ub) ** 2 / den)


def resolution_factor(n_a: int, n_b: int, ci: float = 0.95) -> float:
    """The half-width of the Welch interval in units of the seed s.d. when both arms share one s.d.:
    ``t_{(1+ci)/2, df} * sqrt(1/n_a + 1/n_b)``, ``df`` the Welch-Satterthwaite value at equal variances.
    Needs ``n_a, n_b >= 2``."""
    if n_a < 2 or n_b < 2:
        raise ValueError(f"a Welch interval needs >= 2 seeds per arm, got {n_a} and {n_b}")
    df = welch_df(1.0, n_a, 1.0, n_b)
    return t_ppf(0.5 + ci / 2.0, df) * math.sqrt(1.0 / n_a + 1.0 / n_b)


def paired_resolution_factor(n: int, ci: float = 0.95) -> float:
    """The half-width of the paired interval over ``n`` seeds in units of the s.d. of the per-seed
    differences: ``t_{(1+ci)/2, n-1} / sqrt(n)``. Needs ``n >= 2``."""
    if n < 2:
        raise ValueError(f"a paired interval needs >= 2 seeds, got {n}")
    return t_ppf(0.5 + ci / 2.0, n - 1) / math.sqrt(n)


def welch_interval(arm: np.ndarray, base: np.ndarray, *, ci: float = 0.95) -> dict:
    """Welch's ``ci`` interval for ``mean(arm) - mean(base)``, each a 1-D array of per-seed values (nats;
    non-finite values are left out and counted).

    Returns a dict: ``gap``, ``lo``, ``hi``, ``half_width`` (the smallest resolvable gap), ``se``,
    ``df``, ``t`` (the quantile used), ``n_arm``, ``n_base``, ``sd_arm``, ``sd_base`` (ddof=1),
    ``n_excluded``, ``method``, ``ci``, ``indistinguishable`` (the interval covers 0) and ``note``.
    With fewer than 2 finite seeds in an arm the interval fields are None and ``note`` says why; with
    no spread in either arm the interval is the point (half-width 0) and ``note`` says so.
    """
    a = np.asarray(arm, dtype=np.float64).ravel()
    b = np.asarray(base, dtype=np.float64).ravel()
    excluded = int((~np.isfinite(a)).sum() + (~np.isfinite(b)).sum())
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    out = _without_interval(
        METHOD,
        ci,
        a,
        b,
        excluded,
        gap=float(a.mean() - b.mean()) if a.size and b.size else None,
        note=f"{excluded} non-finite seed value(s) left out" if excluded else None,
    )
    if a.size < 2 or b.size < 2:
        out["note"] = (
            f"no Welch interval: it needs >= 2 seeds with a finite value per arm (have {a.size} and {b.size})"
        )
        return out
    var_a, var_b = float(a.var(ddof=1)), float(b.var(ddof=1))
    se = math.sqrt(var_a / a.size + var_b / b.size)
    df = welch_df(var_a, a.size, var_b, b.size)
    if df is None:
        half, t = 0.0, None
        out["note"] = "no seed-to-seed spread in either arm: the interval is the point estimate"
    else:
        t = t_ppf(0.5 + ci / 2.0, df)
        half = t * se
    return _with_interval(out, half=half, se=se, df=df, t=t)


def _without_interval(
    method: str,
    ci: float,
    a: np.ndarray,
    b: np.ndarray,
    excluded: int,
    *,
    gap: float | None,
    note: str | None,
) -> dict:
    """The result dict of :func:`welch_interval` and :func:`paired_interval` before the interval is
    known: the finite per-seed values ``a`` and ``b`` of each arm, their counts and s.d. (ddof=1, None
    below 2), the interval fields None (:func:`_with_interval` fills them in)."""
    return {
        "method": method,
        "ci": ci,
        "n_arm": int(a.size),
        "n_base": int(b.size),
        "n_excluded": excluded,
        "gap": gap,
        "lo": None,
        "hi": None,
        "half_width": None,
        "se": None,
        "df": None,
        "t": None,
        "sd_arm": float(a.std(ddof=1)) if a.size >= 2 else None,
        "sd_base": float(b.std(ddof=1)) if b.size >= 2 else None,
        "indistinguishable": None,
        "note": note,
    }


def _with_interval(out: dict, *, half: float, se: float, df: float | None, t: float | None) -> dict:
    """``out`` with the interval ``gap +- half`` and its ``se``, ``df``, ``t`` and verdict filled in."""
    gap = out["gap"]
    out.update(
        lo=gap - half,
        hi=gap + half,
        half_width=half,
        se=se,
        df=df,
        t=t,
        indistinguishable=bool(gap - half <= 0.0 <= gap + half),
    )
    return out


def paired_interval(arm: np.ndarray, base: np.ndarray, *, ci: float = 0.95) -> dict:
    """The paired t ``ci`` interval for ``mean(arm - base)``: ``arm[i]`` and ``base[i]`` are the values
    (nats) of the two runs of seed i. A seed whose value is not finite in either run is left out
    (both of its runs) and counted.

    Returns the dict of :func:`welch_interval` (``df`` = pairs - 1, ``n_arm`` = ``n_base`` = pairs)
    with ``sd_diff`` (the s.d. of the differences, ddof=1) and ``pair_corr`` (the correlation of the
    two arms' values over the seeds; None below 3 pairs or without spread) added.

    Raises:
        ValueError: ``arm`` and ``base`` differ in length.
    """
    a = np.asarray(arm, dtype=np.float64).ravel()
    b = np.asarray(base, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired values must have one per seed in both arms, got {a.size} and {b.size}")
    keep = np.isfinite(a) & np.isfinite(b)
    excluded = int((~keep).sum())
    a, b = a[keep], b[keep]
    d = a - b
    n = int(d.size)
    out = _without_interval(
        PAIRED_METHOD,
        ci,
        a,
        b,
        excluded,
        gap=float(d.mean()) if n else None,
        note=f"{excluded} seed(s) with a non-finite value left out (both runs)" if excluded else None,
    )
    out.update(sd_diff=float(d.std(ddof=1)) if n >= 2 else None, pair_corr=None)
    if n >= 3 and a.std() > 0 and b.std() > 0:
        out["pair_corr"] = float(np.corrcoef(a, b)[0, 1])
    if n < 2:
        out["note"] = f"no paired interval: it needs >= 2 seeds with finite values in both arms (have {n})"
        return out
    se = out["sd_diff"] / math.sqrt(n)
    if se == 0.0:
        half, t = 0.0, None
        out["note"] = "every seed's difference is the same: the interval is the point estimate"
    else:
        t = t_ppf(0.5 + ci / 2.0, n - 1)
        half = t * se
    return _with_interval(out, half=half, se=se, df=float(n - 1), t=t)
