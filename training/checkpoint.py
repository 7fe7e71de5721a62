"""Checkpoint directory layout, completeness, the "latest" marker, retention and resume compatibility.

Layout (Megatron-LM's convention)::

    <checkpoint.dir>/
        iter_0000040/                         a complete checkpoint
            <engine files>                    CPU: model.pt, optimizer.pt; GPU: megatron-core torch_dist files
            rng/rank_00000.pt ...             per-rank RNG states (python, numpy, torch, CUDA)
            config.json                       the resolved config
            trainer_state.json                iteration, consumed samples/tokens, non-finite count,
                                              data identity
            manifest.json                     written last: every file above with its size
        latest_checkpointed_iteration.txt     "40", written (atomically) only after iter_0000040/ is complete

A save writes into ``iter_XXXXXXX.tmp/``, writes ``manifest.json`` last, fsyncs, renames the
directory to ``iter_XXXXXXX/`` and only then replaces the marker (write to a temporary file, fsync,
rename). A save that dies midway therefore leaves a ``.tmp`` directory (ignored and removed by the
next save) and never becomes the latest. A checkpoint is *complete* when its manifest exists and
every listed file has the listed size; :func:`find_latest` checks the one the marker names and, if it
is incomplete (truncated, deleted files), warns and falls back to the newest complete older one.

Resume compatibility (:func:`check_resume_compatible`): the saved resolved config is compared with
the new one key by key, except keys that do not change what is trained (:data:`FREE_KEYS`); any
other difference, and a different dataset identity (key ``data.identity``), stops the job with a
message naming each key, unless the key (or its section) is listed in
``checkpoint.allow_config_change``.

The names above are spelled once, below (:data:`MARKER`, :func:`iter_dir`, :func:`tmp_dir`,
:func:`rng_file`, ...); the trainer and the engines build their paths with them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from .resolved import flatten, key_matches

__all__ = [
    "CONFIG_FILE",
    "ITER_PREFIX",
    "MANIFEST",
    "MARKER",
    "TRAINER_STATE_FILE",
    "ConfigMismatchError",
    "check_resume_compatible",
    "find_latest",
    "finish_save",
    "iter_dir",
    "prepare_tmp_dir",
    "prune",
    "read_json",
    "rng_file",
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


class ConfigMismatchError(ValueError):
    """The new config differs from the checkpoint's in keys that change the training run."""


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


def prepare_tmp_dir(root: str | os.PathLike, iteration: int) -> Path:
    """Create an empty ``iter_XXXXXXX.tmp/`` under ``root`` (call on one rank, then barrier)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f"{ITER_PREFIX}*{TMP_SUFFIX}"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = tmp_dir(root, iteration)
    tmp.mkdir()
    return tmp


def _fsync_tree(path: Path) -> None:
    for sub, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(sub, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(sub))


def finish_save(
    root: str | os.PathLike, iteration: int, tmp: Path, *, config: dict, trainer_state: dict, keep_last: int
) -> Path:
    """Complete a save (one rank, after every rank has written into ``tmp``): config, trainer state,
    manifest (last), fsync, rename to ``iter_XXXXXXX/``, marker, prune. Returns the final directory."""
    root = Path(root)
    write_json(tmp / CONFIG_FILE, config)
    write_json(tmp / TRAINER_STATE_FILE, trainer_state)
    files = {}
    for sub, _, names in os.walk(tmp):
        for name in names:
            full = Path(sub) / name
            files[str(full.relative_to(tmp))] = full.stat().st_size
    _fsync_tree(tmp)
    write_json(tmp / MANIFEST, {"format": 1, "iteration": iteration, "files": files})
    _fsync_dir(tmp)
    final = iter_dir(root, iteration)
    if final.exists():  # a re-save of the same iteration (e.g. after a resume that did no step)
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    atomic_write_text(root / MARKER, f"{iteration}\n")
    prune(root, keep_last)
    return final


def verify_checkpoint(path: str | os.PathLike) -> str | None:
    """None when ``path`` is a complete checkpoint, else the reason it is not."""
    path = Path(path)
    if not path.is_dir():
        return f"{path} does not exist"
    try:
        manifest = read_json(path / MANIFEST)
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{path / MANIFEST} is missing or unreadable ({type(err).__name__}): the save did not complete"
    for rel, size in files.items():
        full = path / rel
        if not full.is_file():
            return f"{full} is missing"
        if full.stat().st_size != size:
            return f"{full} has {full.stat().st_size} bytes, the manifest says {size} (truncated)"
    return None


def complete_iterations(root: str | os.PathLike) -> list[int]:
    """Iterations of the ``iter_XXXXXXX/`` directories under ``root``, ascending (complete or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    its = [int(m.group(1)) for p in root.iterdir() if (m := _ITER_RE.match(p.name)) and p.is_dir()]
    return sorted(its)


def find_latest(root: str | os.PathLike, *, warn=print) -> tuple[int, Path] | None:
    """The checkpoint to resume from: the marker's if complete, else the newest complete older one.

    Returns None when ``root`` holds no complete checkpoint (a fresh start).
    """
    root = Path(root)
    marker = root / MARKER
    named = None
    if marker.is_file():
        text = marker.read_text().strip()
        if text.isdigit():
            named = int(text)
        else:
            warn(f"checkpoint: ignoring {marker}: {text!r} is not an iteration number")
    candidates = [it for it in complete_iterations(root) if named is None or it <= named]
    if named is not None and named not in candidates:
        candidates.append(named)
    for it in sorted(candidates, reverse=True):
        reason = verify_checkpoint(iter_dir(root, it))
        if reason is None:
            if named is not None and it != named:
                warn(
                    f"checkpoint: WARNING: the latest checkpoint (iteration {named}) is incomplete; "
                    f"resuming from the previous complete one, iteration {it}"
                )
            return it, iter_dir(root, it)
        warn(f"checkpoint: WARNING: skipping iteration {it}: {reason}")
    return None


def prune(root: str | os.PathLike, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` complete checkpoints (and incomplete older ones)."""
    root = Path(root)
    its = complete_iterations(root)
    complete = [it for it in its if verify_checkpoint(iter_dir(root, it)) is None]
    keep = set(complete[-keep_last:])
    newest_kept = max(keep) if keep else None
    for it in its:
        if it not in keep and (newest_kept is None or it < newest_kept):
            shutil.rmtree(iter_dir(root, it), ignore_errors=True)


def config_differences(saved: dict, now: dict) -> list[tuple[str, object, object]]:
    """``(key, saved, now)`` for every resolved-config key that differs, except :data:`FREE_KEYS`."""
    a, b = flatten(saved), flatten(now)
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
    where: str = "the checkpoint",
) -> list[str]:
    """Raise :class:`ConfigMismatchError` for disallowed differences; return the allowed ones (to log)."""
    diffs = config_differences(saved, now)
    if saved_data_identity is not None and data_identity is not None and saved_data_identity != data_identity:
        diffs.append(("data.identity", saved_data_identity, data_identity))
    allowed = [d for d in diffs if any(key_matches(d[0], p) for p in allow)]
    blocked = [d for d in diffs if d not in allowed]
    if blocked:
        lines = "\n".join(f"  {k}: {v0!r} in the checkpoint, {v1!r} now" for k, v0, v1 in blocked)
        keys = ",".join(k for k, _, _ in blocked)
        hint = (
            ""
            if not any(k == "data.identity" for k, _, _ in blocked)
            else "\n(data.identity covers the blend, data seed, seq_length, split, number of samples "
            "(train_iters x global_batch_size) and tokenizer: a different value changes the sample order)"
        )
        raise ConfigMismatchError(
            f"cannot resume from {where}: the config differs in\n{lines}{hint}\n"
            f"If this change is deliberate, allow it with checkpoint.allow_config_change=[{keys}] "
            "(or start a fresh run with checkpoint.load=none or another checkpoint.dir)"
        )
    return [f"{k}: {v0!r} -> {v1!r}" for k, v0, v1 in allowed]
