"""Checkpoint directory layout, completeness, the "latest" marker, retention and resume compatibility.

Layout (Megatron-LM's convention)::

    <checkpoint.dir>/
        iter_0000040/                         a complete checkpoint
            <engine files>                    CPU: model.pt, optimizer.pt; GPU: megatron-core torch_dist files
            rng/rank_00000.pt ...             per-rank RNG states (python, numpy, torch, CUDA)
            config.json                       the resolved config
            trainer_state.json                iteration, consumed samples/tokens, non-finite count,
                                              data identity
            manifest.json                     written last: every file above with its size and CRC-32
        latest_checkpointed_iteration.txt     "40", written (atomically) only after iter_0000040/ is complete

A save writes into ``iter_XXXXXXX.tmp/``, writes ``manifest.json`` last, fsyncs, renames the
directory to ``iter_XXXXXXX/`` and only then replaces the marker (write to a temporary file, fsync,
rename). A save that dies midway therefore leaves a ``.tmp`` directory (ignored and removed by the
next save) and never becomes the latest. A checkpoint is *complete* when its manifest exists and
every listed file has the listed size and checksum; :func:`find_latest` checks the one the marker
names and, if it is incomplete (truncated, deleted files) or damaged (bytes changed at the same
size: bit rot, a bad copy), warns naming the file and falls back to the newest complete older one.
A marker that is missing or not an iteration number (binary garbage, a directory) is reported by
its path and the checkpoint saved last into the directory is used instead (each manifest records
its save's number in the directory, ``save``, and the directory, ``saved_in``): the marker is
rewritten after every save, so that is the one it named, and no work is lost (Megatron-LM exits on
an unreadable marker, which would leave a requeued job failing until someone fixed it). After a
rollback (``checkpoint.load=<iter path>`` or an edited marker), newer iterations saved before it by
the run rolled back are passed over with a warning (:func:`find_latest`). Where a newer iteration's
order is unknown (saved before the field, into another directory, or its manifest damaged), by
iteration, the newest first, as before. A fall-back from a checkpoint that
failed keeps to its trajectory (:func:`same_trajectory`): after a rollback the directory also holds
the other run's newer iterations, and a fall-back to one of those would resume the run that was
rolled back; they are skipped with a warning naming their origin.

Checksums: CRC-32 (stdlib ``zlib.crc32``) of every file, in ``manifest.json`` under ``checksums``
(``checksum: "crc32"``; ``files`` keeps the sizes, as in the manifests written before checksums).
They are computed right after the files are written, before the manifest, each rank hashing a
share of the files (:func:`shard_files`, balanced by size); on resume, each rank verifies its share
again before anything is loaded. A manifest without ``checksums`` (a checkpoint saved before they
were recorded) is still loaded, on sizes only (:func:`has_checksums`; the trainer says so).
Rates (``python bench/checkpoint_checksum.py``, 3 runs on the development CPU, an AMD EPYC with 2
cores shared with other jobs: ``results/checkpoint_checksum_dev_cpu.txt``), in GB/s over a buffer
in memory: crc32 2.5-3.8, adler32 2.9-3.3, sha256 1.7, blake2b 0.7-0.9, xxhash's xxh3_64 18-21 (a
PyPI package, not taken: the stdlib's crc32 is fast enough once the work is shared over ranks).
:func:`file_checksum` on a file just written (page cache): 1.9-2.7 GB/s. The 8B checkpoint
(105 GiB = 113 GB) at that rate: 42-61 s in one process, 5-8 s per rank over 8 ranks, 0.65-0.95 s
per rank over the 64 of its config, at every save and again at every resume (where the files come
from the file system, whose read rate then bounds it). Verification is skipped where it would only
be repeated (:func:`prune`, the non-finite stop's message): those check sizes.

Resume compatibility (:func:`check_resume_compatible`): the saved resolved config is compared with
the new one key by key (a key added since, :data:`ADDED_KEYS`, missing from a saved config counts
as the value that meant what that checkpoint did), except keys that do not change what is trained
(:data:`FREE_KEYS`); any
other difference, a different dataset identity (key ``data.identity``) and different prepared files
at the same prefixes (key ``data.content``) stop the job with a message naming each key, unless the
key (or its section) is listed in ``checkpoint.allow_config_change``.

The names above are spelled once, below (:data:`MARKER`, :func:`iter_dir`, :func:`tmp_dir`,
:func:`rng_file`, ...); the trainer and the engines build their paths with them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import zlib
from pathlib import Path

from .resolved import flatten, key_matches

__all__ = [
    "ADDED_KEYS",
    "CONFIG_FILE",
    "ITER_PREFIX",
    "MANIFEST",
    "MARKER",
    "TRAINER_STATE_FILE",
    "ConfigMismatchError",
    "DamagedCheckpointError",
    "UnsafeCheckpointError",
    "check_resume_compatible",
    "checksum_shard",
    "file_checksum",
    "find_latest",
    "finish_save",
    "has_checksums",
    "iter_dir",
    "prepare_tmp_dir",
    "origin_of",
    "prune",
    "read_checkpoint_json",
    "read_json",
    "read_marker",
    "rng_file",
    "save_number",
    "shard_files",
    "tmp_dir",
    "verify_checkpoint",
]

# ------------------------------------------------------------------- names (the layout above)
ITER_PREFIX = "iter_"  # + the iteration in 7 digits: a checkpoint directory
TMP_SUFFIX = ".tmp"  # a checkpoint directory being written
CONFIG_FILE = "config.json"
TRAINER_STATE_FILE = "trainer_state.json"
MANIFEST = "manifest.json"
MARKER = "latest_checkpointed_iteration.txt"
RNG_DIR = "rng"
MANIFEST_FORMAT = 2  # 1: sizes only; 2: sizes and checksums
CHECKSUM = "crc32"  # the manifest's ``checksum``: the algorithm of its ``checksums``
_HASH_CHUNK = 16 * 2**20
_ITER_RE = re.compile(rf"^{ITER_PREFIX}(\d{{7}})$")
# Resolved-config keys that may change freely between a checkpoint and its resume.
FREE_KEYS = (
    "attention.backend",
    "attention.options",
    "checkpoint.*",
    "logging.*",
    "validation.*",
    "runtime.*",
    "data.cache_dir",
    "data.num_workers",
)


# Keys added to the resolved config after checkpoints were written, with the value that means what
# those checkpoints did: a saved config without such a key is compared as if it held that value.
ADDED_KEYS = {
    "projection.fp8_weight_cache": True,  # 2026-12-03; before, megatron-core's default: the cache on
    "attention.fuse_rope": False,  # 2026-12-04; before, RoPE was megatron-core's
}


class ConfigMismatchError(ValueError):
    """The new config differs from the checkpoint's in keys that change the training run."""


class NoUsableCheckpointError(ValueError):
    """``iter_*`` directories exist, but none that the run may resume from is complete and readable
    (exit code 2, labelled "cannot resume", not "configuration error": nothing in the config is
    wrong)."""


class DamagedCheckpointError(ValueError):
    """A checkpoint file exists and has its size but cannot be read back (does not deserialize)."""


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds a pickle that would build something other than data (a global outside the
    allow-list of its loader): not a damage, so the trainer stops rather than falling back."""


def iter_dir(root: str | os.PathLike, iteration: int) -> Path:
    """``<root>/iter_XXXXXXX``: the checkpoint of ``iteration``."""
    return Path(root) / f"{ITER_PREFIX}{iteration:07d}"


def tmp_dir(root: str | os.PathLike, iteration: int) -> Path:
    """``<root>/iter_XXXXXXX.tmp``: where the save of ``iteration`` writes before the rename."""
    final = iter_dir(root, iteration)
    return final.with_name(final.name + TMP_SUFFIX)


def rng_file(ckpt_dir: str | os.PathLike, rank: int) -> Path:
    """``<ckpt_dir>/rng/rank_XXXXX.pt``: the RNG states of ``rank`` (written by the engines)."""
    return Path(ckpt_dir) / RNG_DIR / f"rank_{rank:05d}.pt"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file, fsync and rename (readers see old or new)."""
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_json(path: Path, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def read_json(path: Path):
    with open(path) as f:
        return json.load(f)


def read_checkpoint_json(path: str | os.PathLike):
    """A checkpoint's JSON file (``config.json``, ``trainer_state.json``) as Python objects.

    Raises:
        DamagedCheckpointError: the file is missing, not UTF-8 or not JSON (names the file).
    """
    try:
        return read_json(Path(path))
    except (OSError, ValueError) as err:
        raise DamagedCheckpointError(f"{path} cannot be read as JSON ({type(err).__name__})") from None


def prepare_tmp_dir(root: str | os.PathLike, iteration: int) -> Path:
    """Create an empty ``iter_XXXXXXX.tmp/`` under ``root`` (call on one rank, then barrier); the
    ``.tmp`` directories and marker temporary files (:func:`atomic_write_text`'s) that a killed save
    left are removed first (found in review, 2026-12-06: a marker's stayed for good)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{ITER_PREFIX}*{TMP_SUFFIX}"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in root.glob(f"{MARKER}.tmp-*"):
        stale.unlink(missing_ok=True)
    tmp = tmp_dir(root, iteration)
    tmp.mkdir()
    return tmp


def _fsync_tree(path: Path) -> None:
    for sub, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(sub, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(sub))


def _file_sizes(ckpt_dir: Path) -> dict[str, int]:
    """``{path relative to ckpt_dir: bytes}`` of every file under ``ckpt_dir``."""
    sizes = {}
    for sub, _, names in os.walk(ckpt_dir):
        for name in names:
            full = Path(sub) / name
            sizes[str(full.relative_to(ckpt_dir))] = full.stat().st_size
    return sizes


def file_checksum(path: str | os.PathLike) -> str:
    """CRC-32 (``zlib.crc32``) of the file's bytes, as 8 hex digits (read in 16 MiB chunks)."""
    crc = 0
    buf = bytearray(_HASH_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
    return f"{crc:08x}"


def shard_files(sizes: dict[str, int], rank: int, world_size: int) -> list[str]:
    """The files ``rank`` of ``world_size`` hashes: largest first, each to the least-loaded rank.

    Deterministic (the same ``sizes`` give every rank the same partition); the shares are disjoint,
    cover every file, and differ in bytes by at most the largest file.
    """
    if world_size <= 1:
        return sorted(sizes)
    load = [0] * world_size
    mine = []
    for rel in sorted(sizes, key=lambda r: (-sizes[r], r)):
        owner = min(range(world_size), key=lambda r: (load[r], r))
        load[owner] += sizes[rel]
        if owner == rank:
            mine.append(rel)
    return sorted(mine)


def checksum_shard(ckpt_dir: str | os.PathLike, rank: int, world_size: int) -> dict[str, str]:
    """``{relative path: checksum}`` of this rank's share (:func:`shard_files`) of the files under
    ``ckpt_dir`` (call on every rank after all have written; give the union to :func:`finish_save`)."""
    ckpt_dir = Path(ckpt_dir)
    return {
        rel: file_checksum(ckpt_dir / rel) for rel in shard_files(_file_sizes(ckpt_dir), rank, world_size)
    }


def finish_save(
    root: str | os.PathLike,
    iteration: int,
    tmp: Path,
    *,
    config: dict,
    trainer_state: dict,
    keep_last: int,
    checksums: dict[str, str] | None = None,
) -> Path:
    """Complete a save (one rank, after every rank has written into ``tmp``): config, trainer state,
    manifest (last, with every file's size and checksum and the save's number in ``root``:
    :func:`save_number`), fsync, rename to ``iter_XXXXXXX/``, marker, prune. Returns the final
    directory.

    ``checksums``: the files other ranks hashed (:func:`checksum_shard`); every file not in it is
    hashed here.
    """
    root = Path(root)
    write_json(tmp / CONFIG_FILE, config)
    write_json(tmp / TRAINER_STATE_FILE, trainer_state)
    files = _file_sizes(tmp)
    given = checksums or {}
    sums = {rel: given[rel] if rel in given else file_checksum(tmp / rel) for rel in files}
    _fsync_tree(tmp)
    earlier = (save_number(iter_dir(root, it), root) for it in complete_iterations(root))
    number = 1 + max((n for n in earlier if n is not None), default=0)
    write_json(
        tmp / MANIFEST,
        {
            "format": MANIFEST_FORMAT,
            "iteration": iteration,
            "files": files,
            "checksum": CHECKSUM,
            "checksums": sums,
            # which save was the last where no marker says (find_latest): its number in this directory,
            # not a clock (nodes' clocks differ); the time for people
            "saved_in": str(root.resolve()),
            "save": number,
            "saved_at": time.time(),
        },
    )
    _fsync_dir(tmp)
    final = iter_dir(root, iteration)
    if final.exists():  # a re-save of the same iteration (e.g. after a resume that did no step)
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    atomic_write_text(root / MARKER, f"{iteration}\n")
    prune(root, keep_last, saved=iteration, origin=trainer_state.get("origin"))
    return final


def _read_manifest(path: Path) -> tuple[dict | None, str | None]:
    """(manifest, None), or (None, why it cannot be used)."""
    try:
        manifest = read_json(path / MANIFEST)
        files = manifest["files"]
        if not isinstance(files, dict) or not all(isinstance(v, int) for v in files.values()):
            raise TypeError("files is not a {path: size} map")
        sums = manifest.get("checksums")
        if sums is not None and not isinstance(sums, dict):
            raise TypeError("checksums is not a {path: checksum} map")
    except (OSError, ValueError, KeyError, TypeError) as err:
        return None, (
            f"{path / MANIFEST} is missing or unreadable ({type(err).__name__}): the save did not "
            "complete, or the manifest is damaged"
        )
    return manifest, None


def has_checksums(path: str | os.PathLike) -> bool:
    """Whether the manifest of checkpoint ``path`` records checksums (False: saved before they were)."""
    manifest, _ = _read_manifest(Path(path))
    return manifest is not None and manifest.get("checksums") is not None


def verify_checkpoint(
    path: str | os.PathLike, *, checksums: bool = True, shard: tuple[int, int] = (0, 1)
) -> str | None:
    """None when ``path`` is a complete, undamaged checkpoint, else the reason it is not (naming the file).

    Every listed file must exist with its listed size; with ``checksums``, the files of this rank's
    share (``shard`` = (rank, world size), :func:`shard_files`) must also have their recorded
    checksum (read in full: ``checksums=False`` for the cheap check). A manifest without checksums
    passes on sizes (see :func:`has_checksums`).
    """
    path = Path(path)
    if not path.is_dir():
        return f"{path} does not exist"
    manifest, why = _read_manifest(path)
    if manifest is None:
        return why
    files = manifest["files"]
    for rel, size in files.items():
        full = path / rel
        if not full.is_file():
            return f"{full} is missing"
        if full.stat().st_size != size:
            return f"{full} has {full.stat().st_size} bytes, the manifest says {size} (truncated)"
    sums = manifest.get("checksums")
    if not checksums or sums is None:
        return None
    if manifest.get("checksum") != CHECKSUM:
        algo = manifest.get("checksum")
        return f"{path / MANIFEST} records {algo!r} checksums; this version verifies {CHECKSUM}"
    for rel in shard_files(files, *shard):
        if rel not in sums:
            return f"{path / MANIFEST} lists {rel} without a checksum (the manifest is damaged)"
        got = file_checksum(path / rel)
        if got != sums[rel]:
            return (
                f"{path / rel} is damaged: its {CHECKSUM} is {got}, the manifest says {sums[rel]} "
                "(its bytes changed after the save, at the same size)"
            )
    return None


def complete_iterations(root: str | os.PathLike) -> list[int]:
    """Iterations of the ``iter_XXXXXXX/`` directories under ``root``, ascending (complete or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    its = [int(m.group(1)) for p in root.iterdir() if (m := _ITER_RE.match(p.name)) and p.is_dir()]
    return sorted(its)


def iteration_of(path: str | os.PathLike) -> int | None:
    """The iteration of an ``iter_XXXXXXX`` directory's name, else None."""
    m = _ITER_RE.match(Path(path).name)
    return None if m is None else int(m.group(1))


def read_marker(root: str | os.PathLike, *, warn=print) -> int | None:
    """The iteration the marker names; None when there is no marker or it is not a number (warned,
    naming the marker's path: binary garbage, an empty file, a directory)."""
    marker = Path(root) / MARKER
    if not marker.exists():
        return None
    try:
        raw = marker.read_bytes()
    except OSError as err:
        warn(
            f"checkpoint: WARNING: cannot read {marker} ({type(err).__name__}: {err.strerror}); "
            f"looking for the checkpoint saved last under {root} instead"
        )
        return None
    text = raw.decode("ascii", errors="replace").strip()
    if text.isascii() and text.isdigit():
        return int(text)
    shown = raw[:40] + (b"..." if len(raw) > 40 else b"")
    warn(
        f"checkpoint: WARNING: {marker} is damaged: {len(raw)} bytes that are not an iteration number "
        f"({shown!r}); looking for the checkpoint saved last under {root} instead"
    )
    return None


def find_latest(
    root: str | os.PathLike,
    *,
    warn=print,
    verify=verify_checkpoint,
    before: int | None = None,
    same=None,
    trace: dict | None = None,
    share=None,
) -> tuple[int, Path] | None:
    """The checkpoint to resume from: the marker's if complete, else the newest complete older one
    of the same trajectory.

    Args:
        warn: receives a line for every checkpoint skipped (naming the file at fault, or the other
            trajectory's origin) and for a damaged marker (then every ``iter_*`` directory is a
            candidate).
        verify: ``path -> reason or None``, :func:`verify_checkpoint` by default (sizes and
            checksums of every file); the trainer passes one that shares the checksums over ranks.
        before: only iterations below it (the fall-back after ``before`` failed to load).
        same: ``(candidate, failed) -> bool or None``, :func:`same_trajectory` by default; the
            trainer passes one that decides on one rank and shares the answer (every rank must call
            ``verify`` on the same checkpoints).
        trace: a dict that receives ``"origin"``, the resolved path of the checkpoint returned, when
            it is an ancestor on the failed checkpoint's trajectory with another origin of its own
            (a rollback's start checkpoint, or one before it): the resumed run is a trajectory started
            there, as ``checkpoint.load`` of it would start one, and its saves carry that origin
            (keeping the failed trajectory's origin would make a save at that origin's iteration
            name itself).
        share: ``value -> value`` applied to what this process read of ``root`` (the marker's
            iteration and the ``iter_*`` directories); the trainer passes one that returns rank 0's
            reading on every rank, so that every rank walks the same candidates into ``verify`` (a
            collective) even where one rank's read of the marker failed.

    Once a checkpoint has failed (``before``, or the marker's checkpoint when it does not verify),
    the older ones are taken only on its trajectory (``same``; found in review, 2026-12-06: after a
    rollback the fall-back resumed the rolled-back run's newer iteration). Where that trajectory
    cannot be traced (``same`` answers None), the fall-back goes by iteration alone, as before
    origins were recorded. Where the marker is missing or damaged, the checkpoint saved last into
    ``root`` (:func:`_last_saved`) takes its place: the iterations above it were saved before it, by
    a run rolled back since, and are passed over, and the older ones are taken on its trajectory
    (found in review, 2026-12-06: the newest iteration, the rolled-back run's, was resumed). Where
    the order of an iteration above it is unknown, by iteration alone, as before.
    Returns None when ``root`` holds no such complete checkpoint (a fresh start where it holds none).
    """
    root = Path(root)
    same = same_trajectory if same is None else same
    named, listed = (read_marker(root, warn=warn), complete_iterations(root))
    if share is not None:
        named, listed = share((named, listed))
    if before is not None and named is not None and named >= before:
        named = None
    candidates = [it for it in listed if (named is None or it <= named) and (before is None or it < before)]
    if named is not None and named not in candidates:
        candidates.append(named)
    failed = iter_dir(root, before) if before is not None else None
    if named is None and before is None and len(candidates) > 1:
        if not (root / MARKER).exists():
            warn(
                f"checkpoint: WARNING: {root / MARKER} is missing; looking for the checkpoint saved last "
                "instead"
            )
        last = _last_saved(root, candidates, warn=warn, share=share)
        if last is not None:  # the iterations above it were saved before it: another run's
            candidates = [it for it in candidates if it <= last]
            failed = iter_dir(root, last)
    traced, skipped = True, []
    for it in sorted(candidates, reverse=True):
        path = iter_dir(root, it)
        if failed is not None and traced:
            on = same(path, failed)
            if on is None:
                traced = False
                warn(
                    f"checkpoint: WARNING: the trajectory of {failed.name} cannot be traced (its trainer "
                    "state, or that of a checkpoint it descends from, is missing, unreadable or damaged, "
                    "or that checkpoint was moved or copied): falling back by iteration alone"
                )
            elif not on:
                skipped.append(it)
                started = origin_of(path) or "scratch, or saved before origins were recorded"
                warn(
                    f"checkpoint: WARNING: skipping iteration {it}: a checkpoint of another trajectory than "
                    f"{failed.name}'s (started from {started}); to resume that trajectory instead, name it: "
                    f"checkpoint.load={path}"
                )
                continue
        reason = verify(path)
        if reason is None:
            if named is not None and it != named:
                own = " of its trajectory" if skipped and traced else ""
                warn(
                    f"checkpoint: WARNING: the latest checkpoint (iteration {named}) is incomplete or "
                    f"damaged; resuming from the previous complete one{own}, iteration {it}"
                )
            if trace is not None and failed is not None and traced:
                ok, origin = _trainer_origin(failed)
                if ok and _trainer_origin(path) != (True, origin):
                    trace["origin"] = str(path.resolve())
            return it, path
        warn(f"checkpoint: WARNING: skipping iteration {it}: {reason}")
        if failed is None and it == named:
            failed = path  # the older ones must be on its trajectory
    return None


def save_number(path: str | os.PathLike, root: str | os.PathLike) -> int | None:
    """The number of checkpoint ``path``'s save among the saves into directory ``root`` (its
    manifest's ``save``: 1 + the highest in the directory at that save), None where the manifest
    cannot be read, predates the field (2026-12-06) or was written into another directory (a copied
    or moved checkpoint: its number counts another directory's saves)."""
    manifest, _ = _read_manifest(Path(path))
    if manifest is None or manifest.get("saved_in") != str(Path(root).resolve()):
        return None
    value = manifest.get("save")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _last_saved(root: Path, candidates: list[int], *, warn, share) -> int | None:
    """:func:`find_latest`'s start where no marker names a checkpoint: the iteration saved last into
    ``root`` (:func:`save_number`), which the marker named (every save rewrites it); None (by
    iteration) where no candidate has a number or one above the last has none (saved before the
    field, copied in, its manifest damaged: its place in the order is unknown). Read by this process,
    then ``share``d (the trainer: rank 0's answer on every rank, so that every rank walks the same
    candidates into the collective verification). Warns where iterations above it were saved
    before it: a run rolled back since (by ``checkpoint.load`` or an edited marker), whose checkpoints
    are kept and not resumed. Limit: a marker edited by hand since the last save names another
    checkpoint than the last save; lost before the next save, that edit is not followed."""
    numbers = {it: save_number(iter_dir(root, it), root) for it in candidates}
    known = [(n, it) for it, n in numbers.items() if n is not None]
    last = max(known)[1] if known else None
    unknown = [it for it in candidates if last is not None and it > last and numbers[it] is None]
    if unknown:
        last = None
    if share is not None:
        last, unknown = share((last, unknown))
    if unknown:
        warn(
            "checkpoint: WARNING: no marker names the checkpoint to resume, and the save order of "
            f"iteration(s) {', '.join(map(str, unknown))} is unknown (saved before saves were numbered, "
            "into another directory or by another path to it, or a damaged manifest): going by iteration"
        )
    if last is None:
        return None
    above = [it for it in candidates if it > last]
    if above:
        saves = ", ".join(f"{it} (save {numbers[it]})" for it in above)
        warn(
            f"checkpoint: WARNING: no marker names the checkpoint to resume; the one saved last into "
            f"{root} is iteration {last} (save {numbers[last]}), and iteration(s) {saves} above it were "
            f"saved before it, by a run rolled back since: resuming from {last} (they are kept; to resume "
            "one of them instead, name it: checkpoint.load=<its iter_* path>)"
        )
    return last


def _trainer_origin(path: Path) -> tuple[bool, str | None]:
    """``(readable, origin)`` of checkpoint ``path``'s trainer state (:func:`origin_of`)."""
    try:
        state = read_json(path / TRAINER_STATE_FILE)
    except (OSError, ValueError):
        return False, None
    if not isinstance(state, dict):
        return False, None
    origin = state.get("origin")
    return True, (origin if isinstance(origin, str) else None)


def _trainer_state_intact(path: Path) -> bool:
    """Whether checkpoint ``path``'s trainer state has the size and checksum its manifest lists (a
    manifest without checksums: the size), so that its ``origin`` can be trusted in a checkpoint
    whose other files failed."""
    manifest, _ = _read_manifest(path)
    state = path / TRAINER_STATE_FILE
    if manifest is None or TRAINER_STATE_FILE not in manifest["files"]:
        return False
    try:
        if state.stat().st_size != manifest["files"][TRAINER_STATE_FILE]:
            return False
        want = (manifest.get("checksums") or {}).get(TRAINER_STATE_FILE)
        return want is None or file_checksum(state) == want
    except OSError:
        return False


def same_trajectory(candidate: str | os.PathLike, failed: str | os.PathLike) -> bool | None:
    """Whether checkpoint ``candidate``, older than ``failed``, lies on the trajectory that saved
    ``failed``: saved by it (the same ``origin``: both from scratch, or both started by
    ``checkpoint.load`` of one checkpoint), or, for a trajectory started from a checkpoint, that
    checkpoint itself or one of its own trajectory up to its iteration in its directory (a rollback
    of a rollback goes on up the chain). A candidate newer than the start checkpoint with another
    origin is not on it, wherever the start is now.

    None (not traceable: the caller falls back by iteration) when ``failed``'s trainer state does not
    match its manifest (its origin may be the damage) or cannot be read, or when the history below a
    start checkpoint is needed and that checkpoint no longer exists where its path says, lies in
    another directory (a moved or copied checkpoint directory), cannot be read, or leads back to
    itself. True for a ``candidate`` whose trainer state cannot be read (its verification rejects
    it). Limits: runs are told apart only by their origins, so two rollbacks from one checkpoint
    count as one trajectory (as ``prune`` counts them), and a rollback made by editing the marker
    (no origin) is not told from the run it rolled back; a save that later replaced the start
    checkpoint's iteration stands in for it."""
    candidate, failed = Path(candidate), Path(failed)
    if not _trainer_state_intact(failed):
        return None
    ok, origin = _trainer_origin(failed)
    if not ok:
        return None
    ok, own = _trainer_origin(candidate)
    if not ok:
        return True
    at, seen = iteration_of(candidate), set()
    while True:
        if own == origin:
            return True
        if origin is None:
            return False
        if origin in seen:
            return None  # origins that lead back to themselves
        seen.add(origin)
        start = Path(origin)
        start_at = iteration_of(start)
        if at is not None and start_at is not None and at > start_at:
            return False  # newer than the start, with another origin
        if not start.exists():
            return None  # moved or deleted: its history cannot be followed
        if start.resolve() == candidate.resolve():
            return True
        if start.parent.resolve() != candidate.parent.resolve() or start_at is None or at is None:
            return None  # its history lies in another directory (or a copy of this one)
        ok, origin = _trainer_origin(start)  # the trajectory the start checkpoint was saved by
        if not ok:
            return None


def origin_of(path: str | os.PathLike) -> str | None:
    """The ``origin`` in checkpoint ``path``'s trainer state (``state.TrainerState``): the checkpoint
    its trajectory started from by ``checkpoint.load``, None for one started from scratch, saved
    before 2026-12-06, or whose trainer state cannot be read."""
    return _trainer_origin(Path(path))[1]


def prune(root: str | os.PathLike, keep_last: int, *, saved: int, origin: str | None = None) -> None:
    """After the save of iteration ``saved``: delete all but the newest ``keep_last`` complete
    checkpoints up to ``saved`` (and incomplete older ones). Complete here means sizes only: checking
    checksums would read every kept checkpoint at every save.

    Checkpoints above ``saved`` are left alone: they belong to another trajectory than the one being
    saved (a run resumed from an older iteration by ``checkpoint.load=<path>`` or an edited marker,
    as Megatron-LM's rollback), and counting them as the newest deleted that run's own checkpoints,
    the one of a preemption included (found in review, 2026-12-06). A save at one of their
    iterations replaces it (:func:`finish_save`).

    Checkpoints of another ``origin`` (:func:`origin_of`) are left alone too, at any iteration: after
    such a rollback the new trajectory's saves pass the other's iterations, which then counted as its
    newest and deleted its own (found in review, 2026-12-06, with ``keep_last=3``: the rolled-back
    run's iteration 27 kept, the new run's 20 deleted). They stay until a save at their iteration
    replaces them; nothing resumes from them but a ``checkpoint.load`` naming them.
    """
    root = Path(root)
    its = [it for it in complete_iterations(root) if it <= saved and origin_of(iter_dir(root, it)) == origin]
    complete = [it for it in its if verify_checkpoint(iter_dir(root, it), checksums=False) is None]
    keep = set(complete[-keep_last:])
    newest_kept = max(keep) if keep else None
    for it in its:
        if it not in keep and (newest_kept is None or it < newest_kept):
            shutil.rmtree(iter_dir(root, it), ignore_errors=True)


def config_differences(saved: dict, now: dict) -> list[tuple[str, object, object]]:
    """``(key, saved, now)`` for every resolved-config key that differs, except :data:`FREE_KEYS`; a
    key of :data:`ADDED_KEYS` missing from ``saved`` counts as its value there."""
    a, b = flatten(saved), flatten(now)
    a.update({k: v for k, v in ADDED_KEYS.items() if k in b and k not in a})
    diffs = []
    for key in sorted(set(a) | set(b)):
        if any(key_matches(key, p) for p in FREE_KEYS):
            continue
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            diffs.append((key, a.get(key, "<absent>"), b.get(key, "<absent>")))
    return diffs


def check_resume_compatible(
    saved: dict,
    now: dict,
    *,
    allow: list[str],
    saved_data_identity: str | None,
    data_identity: str | None,
    saved_data_content: str | None = None,
    data_content: str | None = None,
    where: str = "the checkpoint",
) -> list[str]:
    """Raise :class:`ConfigMismatchError` for disallowed differences; return the allowed ones,
    ``(key, value in the checkpoint, value now)`` each (the trainer logs them and records them in the
    resume event: :mod:`training.records`).

    The data identities (``data.identity``: megatron-core's, of paths and settings) and contents
    (``data.content``: :func:`data.loader.content_key` of the files) count as differences only where
    both sides have one (checkpoints saved before 2026-12-06 have no content)."""
    diffs = config_differences(saved, now)
    if saved_data_identity is not None and data_identity is not None and saved_data_identity != data_identity:
        diffs.append(("data.identity", saved_data_identity, data_identity))
    if saved_data_content is not None and data_content is not None and saved_data_content != data_content:
        diffs.append(("data.content", saved_data_content, data_content))
    allowed = [d for d in diffs if any(key_matches(d[0], p) for p in allow)]
    blocked = [d for d in diffs if d not in allowed]
    if blocked:
        lines = "\n".join(f"  {k}: {v0!r} in the checkpoint, {v1!r} now" for k, v0, v1 in blocked)
        keys = ",".join(k for k, _, _ in blocked)
        hint = ""
        if any(k == "data.identity" for k, _, _ in blocked):
            hint += (
                "\n(data.identity covers the blend, data seed, seq_length, split, number of samples "
                "(train_iters x global_batch_size) and tokenizer: a different value changes the sample order)"
            )
        if any(k == "data.content" for k, _, _ in blocked):
            hint += (
                "\n(data.content is a digest of the prepared .idx files at the corpus prefixes: they were "
                "prepared again or replaced since the checkpoint, so its consumed_samples no longer "
                "points at the next unseen sample)"
            )
        raise ConfigMismatchError(
            f"cannot resume from {where}: the config differs in\n{lines}{hint}\n"
            f"If this change is deliberate, allow it with checkpoint.allow_config_change=[{keys}] "
            "(or start a fresh run in another runtime.output_dir or checkpoint.dir)"
        )
    return allowed
