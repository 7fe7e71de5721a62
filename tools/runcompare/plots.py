"""PNG plots of a comparison (matplotlib, Agg backend): loss vs tokens per arm, gap vs tokens.

The loss panels zoom in on the part of the run where gaps are visible (the y limits leave out the
first 5% of the tokens, where the loss falls from ~12 nats). No point is dropped silently: every
point of a curve that falls above or below the axes is marked at that edge (``^`` / ``v`` at its
x) and a note in the panel says how many there are and how far they go.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .runs import CompareError


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise CompareError(
            "matplotlib is not installed: `.venv/bin/pip install matplotlib` (or pass --no-plots)"
        ) from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    return plt, EngFormatter


def _finite(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64).copy()
    x[~np.isfinite(x)] = np.nan
    return x


def _arm_mean(series: dict, names: list[str]) -> np.ndarray:
    m = np.stack([_finite(series[n]) for n in names])
    ok = np.isfinite(m)
    with np.errstate(invalid="ignore"):
        return np.where(ok.any(0), np.where(ok, m, 0).sum(0) / np.maximum(ok.sum(0), 1), np.nan)


def _ylim(curves: list[np.ndarray], tokens: np.ndarray):
    """Limits that ignore the first 5% of tokens (the initial loss drop dwarfs any gap)."""
    if tokens.size < 2:
        return None
    cut = tokens[0] + 0.05 * (tokens[-1] - tokens[0])
    vals = np.concatenate([c[tokens >= cut] for c in curves])
    vals = vals[np.isfinite(vals)]
    if vals.size == 0:
        return None
    lo, hi = np.quantile(vals, [0.0, 0.995])
    pad = 0.05 * (hi - lo) if hi > lo else 0.05 * max(abs(hi), 1.0)
    return lo - pad, hi + pad


DATA_GID = "data"  # the curves' artists; the edge marks are "clipped-above" / "clipped-below"


def mark_clipped(ax, lo: float, hi: float) -> dict[str, int]:
    """Mark the points of the data curves of ``ax`` outside ``[lo, hi]`` (the y limits about to be
    set): a marker at the top (``^``) or bottom (``v``) edge at each such x, and a note naming the
    count and the extreme value. Returns ``{"above": n, "below": n}`` (points counted per curve)."""
    xs = {"above": [], "below": []}
    ext = {"above": -np.inf, "below": np.inf}
    for line in ax.get_lines():
        if line.get_gid() != DATA_GID:
            continue
        x = np.asarray(line.get_xdata(), dtype=np.float64)
        y = np.asarray(line.get_ydata(), dtype=np.float64)
        ok = np.isfinite(y)
        for side, sel in (("above", ok & (y > hi)), ("below", ok & (y < lo))):
            if sel.any():
                xs[side].append(x[sel])
                ext[side] = max(ext[side], y[sel].max()) if side == "above" else min(ext[side], y[sel].min())
    counts = {}
    for side, edge, marker, va, ypos in (("above", hi, "^", "top", 0.98), ("below", lo, "v", "bottom", 0.02)):
        pts = np.concatenate(xs[side]) if xs[side] else np.zeros(0)
        counts[side] = int(pts.size)
        if not pts.size:
            continue
        ux = np.unique(pts)
        ax.plot(
            ux,
            np.full(ux.shape, edge),
            ls="none",
            marker=marker,
            color="black",
            ms=6,
            clip_on=False,
            gid=f"clipped-{side}",
        )
        word = "largest" if side == "above" else "smallest"
        ax.text(
            0.99,
            ypos,
            f"{marker} {pts.size} point(s) {side} the axis ({word} {ext[side]:.3f}), marked at the edge",
            transform=ax.transAxes,
            ha="right",
            va=va,
            fontsize=8,
            gid=f"clipped-{side}-note",
        )
    return counts


def loss_figure(res: dict):
    """The figure of :func:`plot_losses` (matplotlib Figure; the caller closes it)."""
    plt, Eng = _plt()
    s = res["series"]
    has_val = s["val_tokens"].size > 0
    fig, axes = plt.subplots(2 if has_val else 1, 1, figsize=(10, 8 if has_val else 5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    panels = [("train loss (nats)", s["tokens"], s["loss"])]
    if has_val:
        panels.append(("validation loss (nats)", s["val_tokens"], s["val_loss"]))
    for ax, (ylabel, tok, series) in zip(axes[:, 0], panels):
        means = []
        for i, (label, arm) in enumerate(res["arms"].items()):
            c = colors[i % len(colors)]
            marker = "o" if tok.size < 50 else None
            for n in arm["runs"]:
                ax.plot(
                    tok, _finite(series[n]), color=c, lw=0.6, alpha=0.35, marker=marker, ms=2, gid=DATA_GID
                )
            m = _arm_mean(series, arm["runs"])
            means.append(m)
            tag = " (baseline)" if arm["is_baseline"] and res["comparisons"] else ""
            ax.plot(
                tok,
                m,
                color=c,
                lw=2.0,
                marker=marker,
                ms=3,
                label=f"{label}{tag}, {len(arm['runs'])} seed(s)",
                gid=DATA_GID,
            )
        lim = _ylim(means, tok)
        if lim:
            mark_clipped(ax, *lim)
            ax.set_ylim(*lim)
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_formatter(Eng())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("consumed tokens")
    axes[0, 0].set_title("Loss vs tokens (thin: seeds, thick: arm mean)")
    fig.tight_layout()
    return fig


def plot_losses(res: dict, path: Path) -> None:
    """Train (and validation) loss vs consumed tokens: each seed a thin line, the arm mean thick;
    points outside the zoomed y range are marked at the edge (:func:`mark_clipped`)."""
    plt, _ = _plt()
    fig = loss_figure(res)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_gaps(res: dict, path: Path) -> None:
    """Gap (arm - baseline, nats) vs tokens: per-step gap of the arm means (faint), per-window gap
    (thick segment) with its interval as a band, significant windows marked, the zero line."""
    plt, Eng = _plt()
    s = res["series"]
    has_val = s["val_tokens"].size > 0
    fig, axes = plt.subplots(2 if has_val else 1, 1, figsize=(10, 8 if has_val else 5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    base_runs = res["arms"][res["baseline"]]["runs"]
    pct = f"{round(100 * res['options']['ci'], 2):g}%"
    panels = [("train", s["tokens"], s["loss"], "train_windows")]
    if has_val:
        panels.append(("validation", s["val_tokens"], s["val_loss"], "valid_windows"))
    arm_colors = {label: colors[i % len(colors)] for i, label in enumerate(res["arms"])}
    for ax, (kind, tok, series, key) in zip(axes[:, 0], panels):
        ax.axhline(0.0, color="black", lw=1.0, ls="--")
        for c in res["comparisons"]:
            col = arm_colors[c["arm"]]
            per_step = _arm_mean(series, res["arms"][c["arm"]]["runs"]) - _arm_mean(series, base_runs)
            ax.plot(tok, per_step, color=col, lw=0.5, alpha=0.3, marker="o" if tok.size < 50 else None, ms=2)
            first = True
            for r in c[key]:
                win = res["windows"][r["window"]]
                x = [win["lo_tokens"], win["hi_tokens"]]
                if r["lo"] is not None:
                    ax.fill_between(
                        x, r["lo"], r["hi"], color=col, alpha=0.25, lw=0, label=f"{pct} CI" if first else None
                    )
                if r["gap"] is not None:
                    ax.plot(
                        x,
                        [r["gap"]] * 2,
                        color=col,
                        lw=2.5,
                        label=f"{c['arm']} - baseline ({c['method']})" if first else None,
                    )
                    if r["significant"]:
                        ax.plot([np.mean(x)], [r["gap"]], marker="*", color=col, ms=10, mec="black")
                    first = False
        ax.set_ylabel(f"{kind} loss gap (nats)")
        ax.xaxis.set_major_formatter(Eng())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("consumed tokens")
    axes[0, 0].set_title(f"Gap vs tokens vs {res['baseline']} (band: {pct} CI per window, star: significant)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
