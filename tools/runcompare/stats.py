"""Token windows and bootstrap confidence intervals for loss gaps between two arms.

Units: tokens on the x axis (consumed tokens, as logged), nats for losses and gaps.

A *gap* is ``mean(arm) - mean(baseline)`` where each arm's value is the mean over its seeds of each
run's mean loss over the points (steps or evaluations) of a window. A point where the loss of any
run of either arm is not finite (``NaN`` in the matrices below) is excluded for every run: the
runs stay paired on the same steps, so a NaN early in a window (where the loss is still falling)
cannot bias the gap. Excluded points are counted (``n_excluded``) and the non-finite values
themselves are counted per run elsewhere.

Three bootstrap methods (all percentile intervals, fixed RNG); ``auto`` picks ``hier`` with >= 2 seeds
in both arms, else ``blocks``; the methods that resample seeds do so in pairs (``seeds-paired``,
``hier-paired``) when both arms hold the same seeds:

``seeds``
    Resample each arm's runs (seeds) with replacement, independently per arm; recompute the gap.
    Captures seed-to-seed variation, which is what decides whether a precision change matters.
    Needs at least 2 runs in both arms. With very few seeds the interval is coarse (with 2 seeds
    per arm it is ``[min a - max b, max a - min b]``) and undercovers; the report says so.
``blocks``
    Circular moving-block bootstrap over the points of the window, with the *same* resampled
    indices for every run. Steps are paired across runs because the data order is identical, so
    batch-difficulty noise (shared by all runs) cancels in the gap, while the autocorrelation of
    the per-step gap is kept within blocks. Used with one seed in either arm, where seeds cannot
    be resampled.
``hier``
    Both: resample seeds per arm, and the (shared) step blocks within the window. Adds within-run
    noise on top of seed resampling; conservative with many seeds, better behaved with 2-3.
``seeds-paired``, ``hier-paired``
    The same with the seeds resampled in pairs: one draw of seed indices for both arms, whose runs
    (rows, in seed order) share their seed. A seed sets the initial weights, and every compared run
    reads the same data order, so the two runs of a seed start as one trajectory and differ by what
    precision changes; the part of the seed-to-seed noise they still share cancels in their
    difference. How much is left shared depends on how far the trajectories have diverged: in the
    committed 117M runs (``results/trajectory/``) same-seed runs of the three recipes agree within
    2e-4 nats at step 1, but at step 160 their validation losses differ by 0.04-0.17 nats, as much
    as runs of different seeds do (0.04-0.17). Resampling each arm's seeds independently ignores
    the pairing: too wide where the pairs stay correlated, too narrow where they are anti-correlated
    (found in review, 2026-12-06).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

METHODS = ("seeds", "blocks", "hier")  # what --bootstrap can ask for (besides auto)
PAIRED = {"seeds": "seeds-paired", "hier": "hier-paired"}  # the same, seeds resampled in pairs
ALL_METHODS = (*METHODS, *PAIRED.values())
SEED_METHODS = ("seeds", "hier", *PAIRED.values())  # the methods that resample seeds
STEP_METHODS = ("blocks", "hier", "hier-paired")  # the methods that resample steps (blocks)
_CHUNK = 256  # bootstrap replicates computed per batch at most
_MAX_ELEMENTS = 1 << 24  # bound on runs x replicates x points gathered at once (128 MiB of float64)


class StatsError(ValueError):
    """Bad input to a statistics function (a programming error or unusable data)."""


def window_edges(
    tokens: np.ndarray, *, n_windows: int | None = None, window_tokens: int | None = None
) -> np.ndarray:
    """Edges of the token windows over the aligned grid ``tokens`` (1-D, increasing, tokens).

    ``n_windows``: ``n`` equal-width windows spanning ``[tokens[0], tokens[-1]]``.
    ``window_tokens``: windows ``[0, T), [T, 2T), ...`` up to the last token (last one partial).
    Exactly one of the two must be given. Returns ``n + 1`` float edges; window ``i`` holds the
    points with ``edges[i] <= t < edges[i+1]`` (the last window also holds ``t == edges[-1]``).
    """
    tokens = np.asarray(tokens, dtype=np.float64)
    if tokens.ndim != 1 or tokens.size == 0:
        raise StatsError("token grid must be a non-empty 1-D array")
    if (n_windows is None) == (window_tokens is None):
        raise StatsError("give exactly one of n_windows and window_tokens")
    lo, hi = float(tokens[0]), float(tokens[-1])
    if n_windows is not None:
        if n_windows < 1:
            raise StatsError(f"n_windows must be >= 1, got {n_windows}")
        if hi == lo:
            return np.array([lo, hi])
        return np.linspace(lo, hi, n_windows + 1)
    if window_tokens <= 0:
        raise StatsError(f"window_tokens must be > 0, got {window_tokens}")
    first = math.floor(lo / window_tokens)
    last = math.floor(hi / window_tokens) + 1
    edges = np.arange(first, last + 1, dtype=np.float64) * window_tokens
    if edges[-2] == hi:  # hi sits exactly on an edge: it closes the previous window
        edges = edges[:-1]
    return edges


def assign_windows(tokens: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Window index (int array, same shape as ``tokens``) of each point; -1 outside the edges."""
    tokens = np.asarray(tokens, dtype=np.float64)
    idx = np.searchsorted(edges, tokens, side="right") - 1
    idx[tokens == edges[-1]] = len(edges) - 2
    idx[(tokens < edges[0]) | (tokens > edges[-1])] = -1
    return idx


def default_block_len(x: np.ndarray) -> int:
    """Block length for the circular block bootstrap of the mean of the 1-D series ``x``.

    Politis & White (2004) automatic selection with the Patton, Politis & White (2009)
    correction: the autocorrelation is cut where it becomes insignificant (flat-top kernel), and
    ``b = (2 G^2 / D_CB)^(1/3) n^(1/3)``. Clipped to ``[1, min(3 sqrt(n), n / 3)]``. Non-finite
    values are dropped first. Strongly autocorrelated gaps get long blocks, white noise gets 1.
    """
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = x.size
    if n < 4:
        return 1
    x = x - x.mean()
    var = float(x @ x) / n
    if var == 0.0:
        return 1
    k_n = max(5, math.ceil(math.sqrt(math.log10(n))))
    m_max = min(math.ceil(math.sqrt(n)) + k_n, n - 1)
    acov = np.array([float(x[: n - k] @ x[k:]) / n for k in range(m_max + 1)])
    rho = acov / var
    thresh = 2.0 * math.sqrt(math.log10(n) / n)
    m_hat = m_max
    for m in range(1, m_max + 1):
        run = np.abs(rho[m : min(m + k_n, m_max + 1)])
        if run.size == k_n and np.all(run < thresh):
            m_hat = m - 1
            break
    big_m = min(2 * max(m_hat, 1), m_max)
    ks = np.arange(-big_m, big_m + 1)
    t = np.abs(ks) / big_m
    lam = np.where(t <= 0.5, 1.0, np.where(t <= 1.0, 2.0 * (1.0 - t), 0.0))
    r = acov[np.abs(ks)]
    g_sum = float(np.sum(lam * np.abs(ks) * r))
    g0 = float(np.sum(lam * r))
    d_cb = (4.0 / 3.0) * g0 * g0
    b_max = max(1, math.ceil(min(3.0 * math.sqrt(n), n / 3.0)))
    if d_cb <= 0.0 or g_sum == 0.0:
        return 1
    b = (2.0 * g_sum * g_sum / d_cb) ** (1.0 / 3.0) * n ** (1.0 / 3.0)
    return int(min(max(1, round(b)), b_max))


@dataclass
class GapEstimate:
    """A gap (nats) between two arms over one window, with its bootstrap interval.

    ``lo``/``hi`` are ``None`` when no interval could be formed; ``note`` then says why.
    ``n_points``: points used (finite in every run); ``n_excluded``: points of the window left out
    because some run's loss there is not finite; ``n_boot_used``: bootstrap replicates.
    """

    gap: float | None
    lo: float | None
    hi: float | None
    n_points: int
    method: str | None
    n_boot_used: int = 0
    block_len: int | None = None
    note: str | None = None
    n_excluded: int = 0

    @property
    def significant(self) -> bool:
        """True when the interval exists and excludes 0."""
        return self.lo is not None and self.hi is not None and (self.lo > 0.0 or self.hi < 0.0)

    def covers(self, value: float) -> bool:
        """True when the interval exists and contains ``value``."""
        return self.lo is not None and self.hi is not None and self.lo <= value <= self.hi

    def to_dict(self) -> dict:
        d = asdict(self)
        d["significant"] = self.significant
        return d


def _circular_block_indices(rng: np.random.Generator, n_rep: int, n: int, block_len: int) -> np.ndarray:
    n_blocks = -(-n // block_len)
    starts = rng.integers(0, n, size=(n_rep, n_blocks))
    idx = (starts[:, :, None] + np.arange(block_len)[None, None, :]) % n
    return idx.reshape(n_rep, n_blocks * block_len)[:, :n]


def choose_method(n_arm: int, n_base: int, requested: str = "auto", *, paired: bool = False) -> str:
    """Bootstrap method for an arm with ``n_arm`` runs against a baseline with ``n_base`` runs;
    ``paired``: the two arms hold the same seeds (then ``n_arm == n_base``, and a method that resamples
    seeds is given in its paired form, :data:`PAIRED`).

    ``auto``: ``hier`` when both arms have at least 2 runs, else ``blocks``. (``hier`` rather than
    plain ``seeds``: with 2-3 seeds per arm, resampling seeds alone gives intervals that cover the
    true gap far less often than nominal -- about 2/3 of the time at 2 seeds -- and adding the
    paired step blocks brings it close to nominal; see tests/tools/test_stats.py.)

    Raises:
        StatsError: an unknown ``requested``, a seed-resampling one with fewer than 2 runs in an arm,
            or ``paired`` with unequal run counts.
    """
    if paired and n_arm != n_base:
        raise StatsError(f"paired arms must hold as many runs, have {n_arm} and {n_base}")
    if requested == "auto":
        method = "hier" if (n_arm >= 2 and n_base >= 2) else "blocks"
    elif requested not in METHODS:
        raise StatsError(f"unknown bootstrap method {requested!r}; choose from auto, {', '.join(METHODS)}")
    elif requested in ("seeds", "hier") and (n_arm < 2 or n_base < 2):
        raise StatsError(
            f"bootstrap method {requested!r} resamples seeds and needs >= 2 runs per arm "
            f"(have {n_arm} and {n_base}); use 'blocks' or 'auto'"
        )
    else:
        method = requested
    return PAIRED.get(method, method) if paired else method


def paired_points(arm: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Keep the points (columns) where every run of both arms is finite: ``(arm, base, n_excluded)``."""
    arm = np.asarray(arm, dtype=np.float64)
    base = np.asarray(base, dtype=np.float64)
    keep = np.isfinite(arm).all(axis=0) & np.isfinite(base).all(axis=0)
    return arm[:, keep], base[:, keep], int((~keep).sum())


def point_gap(arm: np.ndarray, base: np.ndarray) -> tuple[float | None, str | None]:
    """Gap (nats) ``mean_runs(mean_points(arm)) - mean_runs(mean_points(base))`` over the points
    finite in every run. ``arm``: (n_arm_runs, n_points), ``base``: (n_base_runs, n_points).
    Returns ``(gap, None)``, or ``(None, reason)`` when no point is left."""
    if arm.shape[1] == 0:
        return None, "no points in window"
    arm, base, _ = paired_points(arm, base)
    if arm.shape[1] == 0:
        return None, "no point of this window has a finite loss in every run"
    return float(arm.mean(axis=1).mean() - base.mean(axis=1).mean()), None


def bootstrap_gap(
    arm: np.ndarray,
    base: np.ndarray,
    *,
    method: str,
    n_boot: int = 2000,
    ci: float = 0.95,
    rng: np.random.Generator,
    block_len: int | None = None,
    min_points: int = 2,
) -> GapEstimate:
    """Gap ``arm - base`` over one window and its percentile bootstrap interval.

    ``arm``: shape ``(n_arm_runs, n_points)``, ``base``: ``(n_base_runs, n_points)``; losses in nats
    at the same (aligned) points, ``NaN`` for non-finite values (such points are dropped for every
    run, see :func:`paired_points`). ``method``: one of :data:`ALL_METHODS` (see the module
    docstring; the paired ones need row i of ``arm`` and of ``base`` to share a seed).
    ``min_points``: fewer points than this gives the point estimate without an interval for the
    step-resampling methods.
    """
    arm = np.asarray(arm, dtype=np.float64)
    base = np.asarray(base, dtype=np.float64)
    if arm.ndim != 2 or base.ndim != 2 or arm.shape[1] != base.shape[1]:
        raise StatsError(f"arm {arm.shape} and base {base.shape} must be (runs, points) with equal points")
    if method not in ALL_METHODS:
        raise StatsError(f"unknown method {method!r}")
    paired = method in PAIRED.values()
    if paired and arm.shape[0] != base.shape[0]:
        raise StatsError(
            f"method {method!r} pairs the runs of both arms, have {arm.shape[0]} and {base.shape[0]}"
        )
    if not (0.0 < ci < 1.0):
        raise StatsError(f"ci must be in (0, 1), got {ci}")
    if n_boot < 1:
        raise StatsError(f"n_boot must be >= 1, got {n_boot}")
    gap, why = point_gap(arm, base)
    arm, base, n_excl = paired_points(arm, base)
    n = arm.shape[1]
    if gap is None:
        return GapEstimate(None, None, None, n, method, note=why, n_excluded=n_excl)
    m_arm, m_base = arm.mean(axis=1), base.mean(axis=1)
    resample_seeds = method in SEED_METHODS
    resample_steps = method in STEP_METHODS
    if resample_seeds and (len(m_arm) < 2 or len(m_base) < 2):
        raise StatsError(f"method {method!r} needs >= 2 runs per arm")
    bl = None
    if resample_steps:
        if n < min_points:
            return GapEstimate(
                gap,
                None,
                None,
                n,
                method,
                note=f"fewer than {min_points} points in window",
                n_excluded=n_excl,
            )
        if block_len is None:
            gap_series = arm.mean(axis=0) - base.mean(axis=0)  # per-point gap of the arm means
            bl = default_block_len(gap_series)
        else:
            bl = min(block_len, n)
        if bl < 1:
            raise StatsError(f"block_len must be >= 1, got {block_len}")
    both = np.concatenate([arm, base], axis=0)
    na = arm.shape[0]
    reps = []
    chunk = max(1, min(_CHUNK, _MAX_ELEMENTS // max(1, both.shape[0] * n)))
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        if resample_steps:
            idx = _circular_block_indices(rng, b, n, bl)  # (b, n), shared by every run: paired steps
            run_means = both[:, idx].mean(axis=-1)  # (runs, b)
        else:
            run_means = np.broadcast_to(np.concatenate([m_arm, m_base])[:, None], (both.shape[0], b))
        ra, rb = run_means[:na], run_means[na:]
        if resample_seeds:
            ia = rng.integers(0, ra.shape[0], size=(b, ra.shape[0]))
            ib = ia if paired else rng.integers(0, rb.shape[0], size=(b, rb.shape[0]))
            cols = np.arange(b)[:, None]
            va = ra.T[cols, ia].mean(axis=1)
            vb = rb.T[cols, ib].mean(axis=1)
        else:
            va, vb = ra.mean(axis=0), rb.mean(axis=0)
        reps.append(va - vb)
    reps = np.concatenate(reps)
    alpha = 1.0 - ci
    lo, hi = np.quantile(reps, [alpha / 2.0, 1.0 - alpha / 2.0])
    note = f"{n_excl} point(s) excluded: non-finite loss in some run" if n_excl else None
    return GapEstimate(gap, float(lo), float(hi), n, method, int(reps.size), bl, note, n_excl)
