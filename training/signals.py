"""Preemption and time budget: a flag set by SIGTERM / SIGUSR1, checked by the loop after every step.

The handler only sets a flag; the loop finishes the current step, all-reduces the flag (so every
rank stops after the same step), saves a checkpoint and exits with :data:`EXIT_PREEMPTED`. The time
budget (``runtime.exit_duration_mins``, measured from process start, as Megatron-LM's
``--exit-duration-in-mins``) does the same with :data:`EXIT_TIME_BUDGET`. Under Slurm, send the
signal with ``--signal=B:USR1@<seconds>`` and forward it from the batch shell (torchrun forwards
SIGTERM to its workers, not SIGUSR1).

Exit codes of ``pretrain_llama.py``:

| code | meaning |
|---|---|
| 0 | done: ``train_iters`` steps completed (final checkpoint saved) |
| 1 | unexpected error (a Python traceback) |
| 2 | configuration error, incompatible resume, an unwritable output/checkpoint dir, no usable checkpoint |
| 3 | preempted by SIGTERM / SIGUSR1: the step finished, a checkpoint was saved (unless ``save=false``) |
| 4 | time budget (``runtime.exit_duration_mins``) reached: a checkpoint was saved (unless ``save=false``) |
| 5 | non-finite loss or gradients with ``runtime.nonfinite=stop``: nothing saved |

Code 2 always comes with a message naming what to change. The output and checkpoint directories are
test-written at start-up, before the first step; "no usable checkpoint" means ``iter_*`` directories
exist but every one is incomplete or damaged (a fresh start next to them is left to the user).
"""

from __future__ import annotations

import signal
import time

__all__ = [
    "EXIT_CONFIG",
    "EXIT_DONE",
    "EXIT_ERROR",
    "EXIT_NONFINITE",
    "EXIT_PREEMPTED",
    "EXIT_TIME_BUDGET",
    "StopFlags",
]

EXIT_DONE = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_PREEMPTED = 3
EXIT_TIME_BUDGET = 4
EXIT_NONFINITE = 5

PROCESS_START = time.time()


class StopFlags:
    """Installs the handlers; :meth:`local_reason` says why this rank wants to stop (0 = keep going)."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, *, exit_duration_mins: float | None, start_time: float = PROCESS_START):
        self.received: int | None = None
        self.deadline = None if exit_duration_mins is None else start_time + 60.0 * exit_duration_mins
        self._previous = {}

    def install(self) -> None:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        self.received = signum

    def local_reason(self) -> int:
        """:data:`EXIT_PREEMPTED`, :data:`EXIT_TIME_BUDGET` or 0."""
        if self.received is not None:
            return EXIT_PREEMPTED
        if self.deadline is not None and time.time() >= self.deadline:
            return EXIT_TIME_BUDGET
        return 0

    def describe(self, reason: int) -> str:
        if reason == EXIT_PREEMPTED:
            name = (
                signal.Signals(self.received).name
                if self.received is not None
                else "a signal on another rank"
            )
            return f"preempted ({name})"
        if reason == EXIT_TIME_BUDGET:
            return "time budget runtime.exit_duration_mins reached"
        return "done"
