"""Compare a BF16 training run with low-precision runs on identical data (used by
``tools/compare_runs.py``): reading run directories, alignment, bootstrap gaps, reports, plots."""

from .analysis import Options, compare
from .runs import CompareError, RunData, align, load_run
from .stats import GapEstimate, bootstrap_gap, choose_method, default_block_len, window_edges

__all__ = [
    "CompareError",
    "GapEstimate",
    "Options",
    "RunData",
    "align",
    "bootstrap_gap",
    "choose_method",
    "compare",
    "default_block_len",
    "load_run",
    "window_edges",
]
