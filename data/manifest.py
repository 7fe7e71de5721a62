"""Manifests (small JSON files written last) that mark a prepared output as complete, plus the
atomic-write and locking helpers used to keep outputs all-or-nothing.

A manifest records each output file's size and sha256; :func:`verify_manifest_outputs` re-checks
them, so an interrupted, truncated or edited output is never taken for a complete one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from data.errors import CorruptDatasetError

MANIFEST_FORMAT = 1


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 hex digest of a file's bytes (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def describe_files(paths: list[str], base: str | os.PathLike) -> dict[str, dict]:
    """``{path relative to base: {"bytes": int, "sha256": str}}`` for manifests."""
    return {os.path.relpath(p, base): {"bytes": os.path.getsize(p), "sha256": file_sha256(p)} for p in paths}


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same directory, fsync, then rename.

    Readers see either the old file, no file, or the complete new one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp-", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj: dict) -> None:
    """:func:`atomic_write_text` of ``json.dumps(obj, indent=2, sort_keys=True)``."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_manifest(path: str | os.PathLike) -> dict | None:
    """The manifest at ``path`` as a dict, or None if absent or not a valid format-1 manifest."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or obj.get("manifest_format") != MANIFEST_FORMAT:
        return None
    return obj


def verify_manifest_outputs(manifest: dict, base: str | os.PathLike, *, hashes: bool = True) -> None:
    """Check every file listed under ``manifest["files"]`` against its recorded size and sha256.

    Args:
        manifest: a dict from :func:`read_manifest`.
        base: directory the recorded relative paths are relative to.
        hashes: also compare sha256 (reads every file), not only sizes.

    Raises:
        CorruptDatasetError: a file is missing or differs (message names it).
    """
    for rel, rec in manifest.get("files", {}).items():
        p = os.path.join(base, rel)
        if not os.path.isfile(p):
            raise CorruptDatasetError(f"{p} listed in the manifest is missing")
        if os.path.getsize(p) != rec["bytes"]:
            raise CorruptDatasetError(f"{p} is {os.path.getsize(p)} bytes, manifest says {rec['bytes']}")
        if hashes and file_sha256(p) != rec["sha256"]:
            raise CorruptDatasetError(f"{p} content differs from its manifest (sha256 mismatch)")


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Exclusive advisory lock (``fcntl.flock``) on ``path`` (created if needed) for the block.

    Serializes preparation between processes (e.g. several ranks starting at once).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
