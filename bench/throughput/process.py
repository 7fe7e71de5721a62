"""Supervising the benchmark's child processes: one at a time, each in its own process group.

A child runs with the benchmark's environment minus the rank variables (each run is one process),
stdout and stderr to its log file, while a thread polls the device's ``memory.used`` with
``nvidia-smi`` (the peak includes the allocator's reserve and the CUDA context). On its time limit
the group gets SIGTERM (the trainer finishes its step and exits) and SIGKILL 20 s later. A SIGTERM
to the benchmark itself (e.g. from ``timeout``) raises :class:`Terminated` in the benchmark, which
stops the running child the same way before it propagates: no run is left holding the GPU. A failed
child is described by :func:`failure_reason` from its exit code and the tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from . import REPO

DIST_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
)


class DeviceMemoryPoller:
    """Polls the device's ``memory.used`` (MiB) with nvidia-smi every ``interval`` s; ``peak_gib``
    (None if unavailable)."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self.peak_mib: float | None = None
        self._stop = threading.Event()
        self._thread = None
        exe = shutil.which("nvidia-smi")
        dev = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
        self._cmd = (
            [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", dev] if exe else None
        )

    def _poll(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(self._cmd, capture_output=True, text=True, timeout=10, check=True).stdout
                value = float(out.strip().splitlines()[0])
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                return
            self.peak_mib = value if self.peak_mib is None else max(self.peak_mib, value)
            self._stop.wait(self.interval)

    def __enter__(self):
        if self._cmd:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    @property
    def peak_gib(self) -> float | None:
        return None if self.peak_mib is None else self.peak_mib / 1024


def child_env() -> dict:
    """The environment of a child process: ours without rank variables (each run is one process)."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_process(argv: list[str], *, log_path: Path, timeout_s: float, poll_memory: bool = True) -> dict:
    """Run ``argv`` (in the repository) in its own process group with stdout+stderr to ``log_path``.

    On timeout: SIGTERM to the group (the trainer finishes its step and exits), SIGKILL after 20 s.
    Returns ``exit_code`` (-N: killed by signal N), ``timed_out``, ``wall_s`` (s), ``peak_device_mem_gib``
    (GiB, None without nvidia-smi).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log, DeviceMemoryPoller() if poll_memory else contextlib.nullcontext() as mem:
        proc = subprocess.Popen(
            argv, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = _stop_group(proc)
        except BaseException:  # Terminated / KeyboardInterrupt: never leave a run holding the GPU
            _stop_group(proc)
            raise
    return {
        "exit_code": code,
        "timed_out": timed_out,
        "wall_s": time.perf_counter() - t0,
        "peak_device_mem_gib": getattr(mem, "peak_gib", None),
    }


def _stop_group(proc: subprocess.Popen) -> int | None:
    """SIGTERM to the child's process group (the trainer finishes its step and exits), SIGKILL after 20 s."""
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    return proc.returncode


class Terminated(Exception):
    """The benchmark itself got SIGTERM (e.g. from ``timeout``): stop, keep what was measured."""


def on_sigterm(signum, frame):
    """SIGTERM handler that raises :class:`Terminated`."""
    # ``timeout`` signals the process and then its group: a second SIGTERM must not interrupt the clean-up
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated("SIGTERM")


@contextlib.contextmanager
def sigterm_raises_terminated():
    """Within the block, a SIGTERM raises :class:`Terminated`; the previous handler is restored after."""
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def failure_reason(exit_code: int | None, timed_out: bool, tail: str, timeout_s: float) -> str:
    """A short reason for a failed process: timeout, out of (GPU) memory, a signal, or the exit code."""
    if timed_out:
        return f"timeout after {timeout_s:.0f} s"
    low = tail.lower()
    if "out of memory" in low or "outofmemoryerror" in low:
        return f"out of memory (exit code {exit_code})"
    if exit_code is not None and exit_code < 0:
        host = " (host memory?)" if -exit_code == signal.SIGKILL else ""
        return f"killed by {signal.Signals(-exit_code).name}{host}"
    return f"exit code {exit_code}"
