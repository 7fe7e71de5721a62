"""Preemption, Ctrl-C and time budget: a flag set by SIGTERM / SIGUSR1 / SIGINT, checked by the loop
after every step.

The handler only sets a flag; the loop finishes the current step, all-reduces the flag (so every
rank stops after the same step), saves a checkpoint and exits with :data:`EXIT_PREEMPTED`. The time
budget (``runtime.exit_duration_mins``, measured from process start, as Megatron-LM's
``--exit-duration-in-mins``) does the same with :data:`EXIT_TIME_BUDGET`. Under Slurm, send the
signal with ``--signal=B:USR1@<seconds>`` and forward it from the batch shell (torchrun forwards
SIGTERM to its workers, not SIGUSR1).

Ctrl-C (SIGINT) in the loop: the first one is handled like SIGTERM (the step finishes, a checkpoint
is saved, exit code 3) and says so on stderr; it also gives SIGINT back its default action, so a
second Ctrl-C ends the process at once without saving, wherever it is (also inside a long CUDA or
NCCL call, where no Python handler could run; the shell reports 130). The last complete checkpoint
stays the one to resume from. A Ctrl-C before the loop stops the start-up (``pretrain_llama.py``
prints one line and exits with :data:`EXIT_INTERRUPTED`).

Exit codes of ``pretrain_llama.py``:

| code | meaning |
|---|---|
| 0 | done: ``train_iters`` steps completed (final checkpoint saved) |
| 1 | unexpected error (a Python traceback) |
| 2 | configuration error, incompatible resume, an unwritable or locked run dir, no usable checkpoint |
| 3 | preempted (SIGTERM, SIGUSR1, a first Ctrl-C): step finished, checkpoint saved (unless ``save=false``) |
| 4 | time budget (``runtime.exit_duration_mins``) reached: a checkpoint was saved (unless ``save=false``) |
| 5 | non-finite loss or gradients with ``runtime.nonfinite=stop``: nothing saved |
| 6 | out of GPU memory (``training.out_of_memory``): nothing saved, the message says what to change |
| 130 | stopped at once by a second Ctrl-C (killed by SIGINT) or by one before the loop: nothing saved |

SIGTERM or SIGUSR1 before the loop (start-up: the process group, the model, the data, the checkpoint
load, minutes for an 8B resume) raises :class:`StartupStop` there (:func:`install_startup_stop`): the
trainer says so in one line and exits with :data:`EXIT_PREEMPTED` at once, nothing being left to
save, so that the launchers requeue the job (found in review, 2026-12-06: the default action ended the
process with 143 and torchrun's launcher with 1, neither requeued). A signal (or Ctrl-C) that lands
inside an import, where a library's ``except`` could swallow the exception and leave a module
half-built, and one in ``pretrain_llama.py``'s own imports and config load before the trainer
(:func:`install_deferred_stop`), is recorded and raised at the next stage of the start-up
(:func:`raise_pending_stop`), at most seconds later.

Code 2 always comes with a message naming what to change; so does code 6, which the launchers do
not requeue (the same config would run out of memory again). The output and checkpoint directories are
test-written at start-up, before the first step; "no usable checkpoint" means ``iter_*`` directories
exist but every one is incomplete or damaged (a fresh start next to them is left to the user).
"""

from __future__ import annotations

import os
import signal
import threading
import time

__all__ = [
    "EXIT_CONFIG",
    "EXIT_DONE",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NONFINITE",
    "EXIT_OUT_OF_MEMORY",
    "EXIT_PREEMPTED",
    "EXIT_TIME_BUDGET",
    "StartupStop",
    "StopFlags",
    "end_startup_stop",
    "install_deferred_stop",
    "install_startup_stop",
    "raise_pending_stop",
    "restore_handlers",
    "write_exit_code",
]

EXIT_DONE = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_PREEMPTED = 3
EXIT_TIME_BUDGET = 4
EXIT_NONFINITE = 5
EXIT_OUT_OF_MEMORY = 6
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process stopped by Ctrl-C

PROCESS_START = time.time()


def write_exit_code(code: int, *, any_rank: bool = False) -> None:
    """Write the exit code to ``$PRETRAIN_EXIT_FILE``, for launchers: by rank 0 only, or by this rank
    whatever its rank with ``any_rank`` (a rank that ran out of memory while rank 0 waits in a
    collective call it will not leave: the launcher ends rank 0, which writes nothing).

    torchrun reports any failing worker as exit code 1, which would hide the distinct codes the
    requeue logic needs (3 preempted, 4 time budget, 6 out of memory: not requeued);
    ``launch/torchrun_node.sh`` and ``launch/slurm_8x8.sbatch`` read this file instead. Written
    atomically (temp file + rename).
    """
    from .ranks import ranks_from_env  # no torch: this may run while torch is being imported

    path = os.environ.get("PRETRAIN_EXIT_FILE")
    if not path or (ranks_from_env()[0] != 0 and not any_rank):
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{code}\n")
    os.replace(tmp, path)


class StartupStop(BaseException):
    """SIGTERM or SIGUSR1 during the start-up (module docstring); ``signum`` is the signal. A
    BaseException, as KeyboardInterrupt, so that no ``except Exception`` of the start-up takes it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


STARTUP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def _in_import(frame) -> bool:
    """Whether ``frame`` (where a signal handler interrupted the program) runs inside an import."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _raise_startup_stop(signum, frame):
    """The trainer's start-up handler of SIGTERM, SIGUSR1 and SIGINT (:func:`install_startup_stop`)."""
    if _in_import(frame):  # raised there, it can be swallowed: the next raise_pending_stop raises it
        _defer_stop(signum, frame)
        return
    raise _stop_exception(signum)


def _stop_exception(signum: int) -> BaseException:
    """What a start-up signal raises: KeyboardInterrupt for SIGINT (a Ctrl-C before the loop),
    :class:`StartupStop` for SIGTERM and SIGUSR1."""
    return KeyboardInterrupt() if signum == signal.SIGINT else StartupStop(signum)


def install_startup_stop() -> dict:
    """SIGTERM and SIGUSR1 raise :class:`StartupStop` from here on, and SIGINT KeyboardInterrupt (where
    it had Python's default handler or :func:`install_deferred_stop`'s), where they interrupt the
    trainer's start-up; inside an import they are recorded instead and raised by the next
    :func:`raise_pending_stop` (found in review, 2026-12-06: a Ctrl-C raised inside ``torch._dynamo``'s
    import was swallowed there and the run crashed on the half-imported module). Returns the handlers
    they had, for :func:`restore_handlers` (empty outside the main thread, where Python sets no
    handler). A signal recorded before is left to :func:`raise_pending_stop`."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {sig: signal.signal(sig, _raise_startup_stop) for sig in STARTUP_SIGNALS}
    if signal.getsignal(signal.SIGINT) in (_defer_stop, signal.default_int_handler):
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _raise_startup_stop)
    return previous


_pending: int | None = None  # the first signal recorded by _defer_stop, until raise_pending_stop


def _defer_stop(signum, frame):
    global _pending
    if _pending is None:
        _pending = signum
    if signum == signal.SIGINT:  # a second Ctrl-C: KeyboardInterrupt at once, wherever it lands
        signal.signal(signal.SIGINT, signal.default_int_handler)


def install_deferred_stop() -> dict:
    """SIGTERM, SIGUSR1 and SIGINT are only recorded from here on, for :func:`raise_pending_stop`
    (a second Ctrl-C raises KeyboardInterrupt at once); returns the handlers they had, for
    :func:`restore_handlers` (empty outside the main thread).

    For ``pretrain_llama.py``'s first seconds (the imports, the config load), before the trainer's
    :func:`install_startup_stop`: an exception raised by a handler inside a library's import can be
    swallowed there (a ``try``/``except`` around an optional import, importlib's callbacks), leaving
    the module half-initialized and the run going on (found in review, 2026-12-06: SIGTERM in the
    first second ended the process with 143, and once raised, trained the whole run or crashed on a
    half-imported ``sympy``)."""
    global _pending
    _pending = None
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _defer_stop) for sig in (*STARTUP_SIGNALS, signal.SIGINT)}


def raise_pending_stop() -> None:
    """Raise what a signal recorded by :func:`install_deferred_stop` asks for, and forget it:
    :class:`StartupStop` for SIGTERM or SIGUSR1, KeyboardInterrupt for SIGINT (a Ctrl-C before the
    loop); nothing when none arrived."""
    global _pending
    signum, _pending = _pending, None
    if signum is not None:
        raise _stop_exception(signum)


def end_startup_stop() -> None:
    """The start-up is over (the loop installs :class:`StopFlags`): a signal recorded during it is
    raised (:func:`raise_pending_stop`), then SIGTERM and SIGUSR1 go back to their default action and
    SIGINT to Python's, which :class:`StopFlags` restores after the loop."""
    raise_pending_stop()
    if threading.current_thread() is threading.main_thread():
        for sig in STARTUP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        if signal.getsignal(signal.SIGINT) in (_defer_stop, _raise_startup_stop):
            signal.signal(signal.SIGINT, signal.default_int_handler)


def restore_handlers(previous: dict) -> None:
    """Give the signals of ``previous`` (:func:`install_startup_stop`'s result) their handlers back."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


class StopFlags:
    """Installs the handlers; :meth:`local_reason` says why this rank wants to stop (0 = keep going).

    Args:
        exit_duration_mins: the time budget (None = none), counted from ``start_time``.
        saving: whether the stop saves a checkpoint (for the Ctrl-C notice).
        announce: write the Ctrl-C notice to stderr (rank 0 only).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(
        self,
        *,
        exit_duration_mins: float | None,
        start_time: float = PROCESS_START,
        saving: bool = True,
        announce: bool = True,
    ):
        self.received: int | None = None
        self.interrupted = False  # a first Ctrl-C came
        self.deadline = None if exit_duration_mins is None else start_time + 60.0 * exit_duration_mins
        self.announce = announce
        then = (
            "saving a checkpoint and exiting" if saving else "exiting (checkpoint.save=false: nothing saved)"
        )
        self.notice = (
            f"pretrain_llama: Ctrl-C: finishing this step, then {then} with code {EXIT_PREEMPTED}; "
            "press Ctrl-C again to stop at once without saving\n"
        ).encode()
        self._previous = {}

    def install(self) -> None:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Restore the handlers found by :meth:`install` (also SIGINT's, after a Ctrl-C)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            # the next Ctrl-C ends the process at once, even inside a long C call (no handler runs)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            self.interrupted = True
            if self.announce:
                os.write(2, self.notice)  # not print(): a handler may run inside another write
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
            if self.received == signal.SIGINT:
                return "interrupted (SIGINT, Ctrl-C)"
            name = (
                signal.Signals(self.received).name
                if self.received is not None
                else "a signal on another rank"
            )
            return f"preempted ({name})"
        if reason == EXIT_TIME_BUDGET:
            return "time budget runtime.exit_duration_mins reached"
        return "done"
