"""One run per directory: a lock file that two jobs writing the same run directory cannot share.

    lock = RunLock.acquire(Path("runs/x"), log=print)   # ValueError when another live run holds it
    ...                                                 # lock.lost: another run took it over
    lock.release()

The same config submitted twice (``sbatch`` run twice, a copy of a job script, a BF16 and an FP8 arm
that forgot to change ``runtime.output_dir``) starts two jobs that save into one checkpoint
directory: each one's ``iter_*`` directories, latest marker and retention pruning overwrite and
delete the other's, and ``metrics.jsonl`` interleaves their records. Megatron-LM leaves that to the
user; here rank 0 holds ``<dir>/run.lock`` for the whole launch (the run directory, and the
checkpoint directory where ``checkpoint.dir`` is elsewhere) and refreshes it every
:data:`BEAT_S` seconds from a daemon thread.

Who may take a lock that is there (no clock is compared across hosts):

- the same Slurm job (``SLURM_JOB_ID``) at a lower ``SLURM_RESTART_COUNT``: a requeued job is its
  own earlier launch;
- a process that is gone from this machine (same host, boot and PID namespace; the PID is not
  running, or runs a process started at another time): a crashed launch relaunched on its node;
- anyone, once the holder's record has not changed for :data:`STALE_S` seconds of watching (a holder
  that is alive rewrites it every :data:`BEAT_S`): a dead holder on another node. The start-up
  waits that long, saying so, and then takes the lock with a warning naming the holder.

A record that changes while it is watched is a live run, and so is a holder whose process runs on
this machine (the PID with the start time it recorded) and rewrote the lock within two beats by
this machine's clock: :meth:`RunLock.acquire` raises
``ValueError`` naming its host, PID, job and directory (exit code 2; nothing is written). A holder
whose lock was taken over (its heartbeat stalled longer than :data:`STALE_S`, a file system hang)
sees another record at its next beat: :attr:`RunLock.lost` names the new holder, and the trainer then
stops before its next save rather than write into the other run's directory.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from .checkpoint import atomic_write_text

__all__ = ["BEAT_S", "LOCK_NAME", "STALE_S", "LockLost", "RunLock", "describe", "this_process"]

LOCK_NAME = "run.lock"
BEAT_S = 30.0  # seconds between two rewrites of a held lock
STALE_S = 180.0  # a lock not rewritten for this long while watched is a dead holder's
POLL_S = 1.0  # seconds between two reads of a lock being watched


class LockLost(Exception):
    """Another run took over a lock this run held (raised by the trainer before a save)."""


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (the process's start time in clock ticks since boot), None
    where it cannot be read (no such process, no ``/proc``)."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]  # fields after the command name start at field 3


def _machine() -> str | None:
    """What tells this machine's PIDs apart from another's: the boot id and this PID namespace
    (containers of one host share the first, not the second). None where ``/proc`` has neither."""
    boot = _read_text("/proc/sys/kernel/random/boot_id")
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = None
    return None if boot is None or ns is None else f"{boot.strip()}/{ns}"


def _restart_count() -> int:
    """``SLURM_RESTART_COUNT`` (how often Slurm requeued or restarted the job; unset: 0)."""
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def this_process() -> dict:
    """The holder record of this process (without ``token`` and ``beat``)."""
    job = os.environ.get("SLURM_JOB_ID") or None
    return {
        "host": socket.gethostname(),
        "machine": _machine(),
        "pid": os.getpid(),
        "pid_start": _start_time(os.getpid()),
        "slurm_job_id": job,
        "slurm_restart_count": _restart_count() if job else None,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _earlier_launch_of_this_job(record: dict, me: dict) -> bool:
    """The holder is this Slurm job before its latest requeue: the same ``SLURM_JOB_ID`` and a lower
    ``SLURM_RESTART_COUNT`` (Slurm ends a job's steps before it requeues it). Two steps of one
    launch (two ``srun`` in one allocation) share the job id but not an earlier restart count, so
    they are told apart by the other rules (found in review, 2026-12-06: the second took the
    first one's lock at once)."""
    if not me["slurm_job_id"] or record.get("slurm_job_id") != me["slurm_job_id"]:
        return False
    theirs = record.get("slurm_restart_count")
    return isinstance(theirs, int) and theirs < me["slurm_restart_count"]


def describe(record: dict | None) -> str:
    """``host H, PID P, Slurm job J, started T`` for a message (the fields a record has)."""
    if not record:
        return "an unreadable holder record"
    parts = [f"host {record.get('host')}", f"PID {record.get('pid')}"]
    if record.get("slurm_job_id"):
        parts.append(f"Slurm job {record['slurm_job_id']}")
    if record.get("started"):
        parts.append(f"started {record['started']}")
    return ", ".join(parts)


def _read(path: Path) -> tuple[bool, dict | None]:
    """(exists, record): record None when the file is there but not a JSON object (half written)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return False, None
    except OSError:
        return True, None
    try:
        record = json.loads(text)
    except ValueError:
        return True, None
    return True, record if isinstance(record, dict) else None


def _on_this_machine(record: dict, me: dict) -> bool:
    """The holder's record names this machine (host, boot and PID namespace) and a PID."""
    if not record.get("machine") or record.get("machine") != me["machine"]:
        return False
    return record.get("host") == me["host"] and isinstance(record.get("pid"), int)


def _gone(record: dict, me: dict) -> bool:
    """The holder ran on this machine and its process is no longer there."""
    if not _on_this_machine(record, me):
        return False
    if record["pid"] == me["pid"]:  # this process: an earlier Trainer in it that did not release
        return True
    now = _start_time(record["pid"])
    return now is None or (record.get("pid_start") is not None and now != record["pid_start"])


def _alive_here(record: dict, me: dict) -> bool:
    """The holder is another process running on this machine now: its PID there with the start time
    it recorded (so not a later process that reused the PID)."""
    if not _on_this_machine(record, me) or record["pid"] == me["pid"] or record.get("pid_start") is None:
        return False
    return _start_time(record["pid"]) == record["pid_start"]


def _written_within(path: Path, seconds: float) -> bool:
    """Whether ``path`` was modified less than ``seconds`` ago by this machine's clock (a holder
    here whose heartbeat has stalled, a hung process, is watched and taken over as one elsewhere)."""
    try:
        return time.time() - path.stat().st_mtime < seconds
    except OSError:
        return False


class _Clock:
    """Time and sleep (tests pass their own)."""

    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)


class RunLock:
    """A held ``run.lock`` (see the module docstring); create it with :meth:`acquire`."""

    def __init__(self, path: Path, record: dict, *, beat_s: float, log):
        self.path = path
        self.record = record
        self.lost: str | None = None  # set by the heartbeat: who holds the lock now
        self._log = log
        self._beat_s = beat_s
        self._stop = threading.Event()
        self._write_lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name=f"run-lock {path}", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(
        cls,
        directory: Path,
        *,
        key: str = "runtime.output_dir",
        log=print,
        beat_s: float | None = None,
        stale_s: float | None = None,
        poll_s: float | None = None,
        clock: _Clock | None = None,
    ) -> RunLock:
        """Take ``<directory>/run.lock`` for this process.

        Args:
            directory: an existing, writable directory (the trainer checks that first).
            key: the config key it comes from, for the messages.
            log: receives the warnings (a lock taken over, the wait for a silent holder).
            beat_s, stale_s, poll_s: the heartbeat period, how long a silent holder is watched,
                and how often its record is read while watched (seconds; default :data:`BEAT_S`,
                :data:`STALE_S`, :data:`POLL_S`, read at the call).
            clock: ``monotonic`` and ``sleep`` (tests).

        Returns:
            The held lock; its heartbeat thread is running.

        Raises:
            ValueError: another live run holds the lock (its record changed while watched); the
                message names it, the directory and what to do. Nothing was written.
        """
        clock = clock or _Clock()
        beat_s = BEAT_S if beat_s is None else beat_s
        stale_s = STALE_S if stale_s is None else stale_s
        poll_s = POLL_S if poll_s is None else poll_s
        path = Path(directory) / LOCK_NAME
        me = this_process()
        record = {**me, "token": uuid.uuid4().hex, "beat": 0}
        watched: tuple | None = None  # (the record's text key, since when it has not changed)
        while True:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    json.dump(record, f)
                return cls(path, record, beat_s=beat_s, log=log)
            exists, held = _read(path)
            if not exists:
                continue  # released meanwhile: try to create it again
            if held is not None:
                if _earlier_launch_of_this_job(held, me):
                    why = "an earlier launch of this Slurm job"
                    return cls._take(path, record, held, why, key, clock, poll_s, beat_s, log)
                if _gone(held, me):
                    why = "a process no longer running here"
                    return cls._take(path, record, held, why, key, clock, poll_s, beat_s, log)
                if _alive_here(held, me) and _written_within(path, 2 * BEAT_S):
                    # found in review, 2026-12-06: watched 20-30 s for a beat first
                    raise ValueError(
                        f"{key} {Path(directory)} is in use by another run ({describe(held)}; its process "
                        "is running on this machine and rewrote its lock within the last "
                        f"{2 * BEAT_S:.0f} s): two runs in one directory overwrite each other's "
                        f"checkpoints and metrics. Wait for it to end, or give this run another {key}; "
                        "nothing was written"
                    )
            seen = json.dumps(held, sort_keys=True) if held is not None else None
            now = clock.monotonic()
            if watched is None:
                watched = (seen, now)
                log(
                    f"run lock: WARNING: {path} is held by {describe(held)}; watching it for up to "
                    f"{stale_s:.0f} s (a live run rewrites it every {beat_s:.0f} s)"
                )
            elif seen != watched[0]:
                if held is None:  # rewritten while read: read again
                    clock.sleep(poll_s)
                    continue
                raise ValueError(
                    f"{key} {Path(directory)} is in use by another run ({describe(held)}; its lock "
                    f"{path} was rewritten {now - watched[1]:.0f} s into watching, so that run is alive): "
                    "two runs in one directory overwrite each other's checkpoints and metrics. Wait for it "
                    f"to end, or give this run another {key}; nothing was written"
                )
            elif now - watched[1] >= stale_s:
                why = f"a holder silent for {now - watched[1]:.0f} s"
                return cls._take(path, record, held, why, key, clock, poll_s, beat_s, log)
            clock.sleep(poll_s)

    @classmethod
    def _take(cls, path, record, held, why, key, clock, poll_s, beat_s, log) -> RunLock:
        log(f"run lock: WARNING: taking over {path} from {describe(held)} ({why})")
        _write(path, record)
        try:
            clock.sleep(poll_s)  # another start-up that took it over at the same time wrote after us
        except BaseException:  # a signal's StartupStop: no lock of ours left behind (found in review)
            _, now = _read(path)
            if now is not None and now.get("token") == record["token"]:
                path.unlink(missing_ok=True)
            raise
        _, now = _read(path)
        if now is None or now.get("token") != record["token"]:
            raise ValueError(
                f"{key} {path.parent}: another run ({describe(now)}) took over its lock {path} at the same "
                f"time as this one; it goes on there. Give this run another {key}; nothing was written"
            )
        return cls(path, record, beat_s=beat_s, log=log)

    def _beat(self) -> None:
        while not self._stop.wait(self._beat_s):
            with self._write_lock:
                if self._stop.is_set():
                    return
                exists, held = _read(self.path)
                if held is not None and held.get("token") == self.record["token"] or not exists:
                    self.record["beat"] += 1
                    try:
                        _write(self.path, self.record)
                    except OSError as err:  # a file system hiccup: the next beat tries again
                        self._log(f"run lock: WARNING: could not refresh {self.path}: {err}")
                    continue
                if held is None:  # half written by another writer: look again at the next beat
                    continue
                self.lost = describe(held)
                self._log(
                    f"run lock: WARNING: {self.path} was taken over by {self.lost} (this run's heartbeat "
                    "stalled); this run saves nothing more there"
                )
                return

    def release(self) -> None:
        """Stop the heartbeat and delete the lock file if it is still this process's."""
        self._stop.set()
        with self._write_lock:
            _, held = _read(self.path)
            if held is not None and held.get("token") == self.record["token"]:
                try:
                    self.path.unlink()
                except OSError:
                    pass
        self._thread.join(timeout=5)


def _write(path: Path, record: dict) -> None:
    """Replace ``path`` by ``record`` in one step (a reader sees the old or the new one)."""
    atomic_write_text(path, json.dumps(record))
