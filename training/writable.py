"""Start-up check that an output directory can be written, so a bad path stops the job before step 1.

    check_writable_dir(Path("runs/x/checkpoints"), "checkpoint.dir")   # ValueError naming the path

Without it, a checkpoint directory that cannot be written (a read-only mount, a path under a
regular file) is found at the first save, after every step before it (500 in the 8B config) is
lost. The check creates the directory (as the run would) and creates and deletes a probe file in
it, which is what a read-only file system, missing permissions or a full inode table refuse.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["check_writable_dir"]

PROBE_PREFIX = ".write-check-"


def _first_file_above(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` (or ``path`` itself) that is not a directory."""
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def check_writable_dir(path: str | os.PathLike, name: str) -> None:
    """Create ``path`` if needed and check that a file can be created in it.

    Args:
        path: the directory.
        name: the config key it comes from (``runtime.output_dir``, ``checkpoint.dir``), for the message.

    Raises:
        ValueError: one sentence naming ``path`` and why it cannot be written.
    """
    path = Path(path)
    fix = f"set {name} to a directory this job can write"
    blocker = _first_file_above(path)
    if blocker is not None:
        where = "is a file" if blocker == path else f"is under {blocker}, which is a file"
        raise ValueError(f"{name} {path} {where}, not a directory; {fix}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{name} {path} cannot be created ({err.strerror or err}); {fix}") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=path)
    except OSError as err:
        raise ValueError(f"{name} {path} is not writable ({err.strerror or err}); {fix}") from None
    os.close(fd)
    os.unlink(probe)
