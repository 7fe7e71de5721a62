"""A torch_dist checkpoint read as data before megatron-core loads it (the GPU engine's resume).

megatron-core's ``dist_checkpointing.load`` reads a torch_dist checkpoint through torch DCP, which
unpickles without restriction in two places: the ``.metadata`` file (``FileSystemReader.
read_metadata``: ``pickle.load``) and every ShardedObject (the ``common_state``, the distributed
optimizer's ``param_state`` and ``param_groups``, Transformer Engine's ``_extra_state``), whose
``torch.save`` bytes ``DefaultLoadPlanner.load_bytes`` reads with ``torch.load(weights_only=False)``.
A crafted checkpoint could run code there (found in review, 2026-12-03; the reviewer ran an
``os.system`` payload through ``load_bytes``).

:func:`vet_torch_dist_checkpoint` reads both as data first, and raises before megatron-core reads
anything:

* ``.metadata`` with an unpickler that resolves only torch DCP's metadata classes
  (:data:`METADATA_GLOBALS`: ``Metadata``, the storage and chunk metadata, ``MetadataIndex``,
  ``StorageMeta``, ``_StorageInfo``), ``torch.Size``, torch dtypes, layouts
  (``torch.serialization._get_layout``), ``pathlib`` paths and ``OrderedDict``;
* every ShardedObject's bytes, located by ``.metadata`` (a file inside the checkpoint directory, an
  offset and a length; no storage transform), with ``torch.load(weights_only=True)``, megatron-core's
  safe globals allowed (``megatron.core.safe_globals.SAFE_GLOBALS``: what megatron-core itself
  loads with ``weights_only=True``), and ``map_location="meta"``: the pickle is vetted, the tensor
  storages are not read (the optimizer state of an 8B model is tens of GB).

The load itself then runs inside :func:`data_only_torch_load`: ``torch.load`` with
``weights_only=True`` (torch DCP's ``load_bytes``, megatron-core's legacy ``common.pt``) and torch
DCP's ``.metadata`` reader with the allow-list unpickler (also its fall-back to a per-rank
``__0.metadata`` when ``.metadata`` fails, which the vetting does not read). So a file replaced
between the vetting and the load, or a file the vetting does not read, is still read as data; the
vetting first makes the refusal a clean error before anything is loaded. Transformer Engine's
``_extra_state`` tensors hold a second pickle, vetted after the load by
``training/te_extra_state.py`` before TE unpickles it.

Errors: a global outside the allow-lists (or a TorchScript archive, which DCP would load with
``torch.jit.load``) is :class:`training.checkpoint.UnsafeCheckpointError` (every rank stops, no
fall-back to an older checkpoint: the trainer); bytes that do not deserialize at all (truncated, not
a pickle, a missing file) are :class:`training.checkpoint.DamagedCheckpointError` (the trainer falls
back to the previous checkpoint). An object's bytes count as damaged only when torch names no
refused global and its ``data.pkl`` does not parse (:func:`refused_pickle`); the trainer has
verified every file's CRC-32 against the manifest before, so damage there is rare.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import pickletools
import zipfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch

from .checkpoint import DamagedCheckpointError, UnsafeCheckpointError
from .engine import describe_load_error, gathered_failures
from .out_of_memory import out_of_memory_error

__all__ = [
    "METADATA_GLOBALS",
    "data_only_torch_load",
    "dist_load_error",
    "read_metadata",
    "refused_pickle",
    "vet_torch_dist_checkpoint",
]

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
# (module, name) the .metadata unpickler may resolve, besides torch dtypes ("torch", <dtype name>)
METADATA_GLOBALS = frozenset(
    {
        *(
            (_DCP_METADATA, name)
            for name in (
                "Metadata",
                "TensorStorageMetadata",
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "TensorProperties",
                "MetadataIndex",
                "StorageMeta",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
    }
)


class _RefusedGlobal(Exception):
    pass


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in METADATA_GLOBALS or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise _RefusedGlobal(f"{module}.{name}")


def read_metadata(ckpt: str | os.PathLike):
    """The ``torch.distributed.checkpoint.metadata.Metadata`` of a torch_dist checkpoint, unpickled
    with the allow-list of :data:`METADATA_GLOBALS` (and torch dtypes).

    Raises:
        UnsafeCheckpointError: the pickle references a global outside the allow-list (names it).
        DamagedCheckpointError: ``.metadata`` is missing, or does not unpickle, or is not a
            ``Metadata`` (names the file).
    """
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    path = Path(ckpt) / ".metadata"
    try:
        with open(path, "rb") as f:
            meta = _load_metadata(f, path)
    except UnsafeCheckpointError:
        raise
    except Exception as err:  # UnpicklingError, EOFError, ValueError (protocol), OSError, ...
        raise DamagedCheckpointError(
            f"{path} does not deserialize as torch_dist metadata ({describe_load_error(err)})"
        ) from None
    if not isinstance(meta, Metadata):
        raise DamagedCheckpointError(
            f"{path} does not deserialize as torch_dist metadata (it holds a {type(meta).__name__})"
        )
    # torch DCP's reader fails on other field types, then falls back to a per-rank metadata file
    fields = (meta.state_dict_metadata, meta.storage_data, getattr(meta, "storage_meta", None))
    if not (
        isinstance(fields[0], dict)
        and isinstance(fields[1], dict | None)
        and isinstance(fields[2], StorageMeta | None)
    ):
        raise DamagedCheckpointError(
            f"{path} does not deserialize as torch_dist metadata (malformed fields: "
            f"{', '.join(type(f).__name__ for f in fields)})"
        )
    return meta


def _load_metadata(f, name):
    """Unpickle a metadata file with :class:`_MetadataUnpickler`; a refused global is
    :class:`UnsafeCheckpointError` (naming ``name`` and the global)."""
    try:
        return _MetadataUnpickler(f).load()
    except _RefusedGlobal as err:
        raise UnsafeCheckpointError(
            f"{name} references {err}, which torch_dist metadata does not hold; this checkpoint was "
            "not written by megatron-core's dist_checkpointing and may run code when unpickled: it "
            "was not loaded"
        ) from None


class _Slice(io.RawIOBase):
    """``length`` bytes of an open binary file from ``offset``, as a seekable file of its own."""

    def __init__(self, f, offset: int, length: int):
        self._f, self._start, self._len, self._pos = f, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._len}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buf) -> int:
        n = max(0, min(len(buf), self._len - self._pos))
        self._f.seek(self._start + self._pos)
        got = self._f.readinto(memoryview(buf)[:n])
        self._pos += got
        return got


def _is_valid_pickle(f) -> bool:
    """Whether ``f`` is a ``torch.save`` zip whose ``data.pkl`` parses as a pickle (read, not run):
    then a ``weights_only`` failure is a refusal of what it builds, else the bytes are damaged."""
    try:
        with zipfile.ZipFile(f) as z:
            name = next(n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
            for _ in pickletools.genops(z.read(name)):
                pass
    except Exception:  # noqa: BLE001 - not a zip, no data.pkl, a truncated or garbled pickle
        return False
    return True


# what torch's weights_only loader says when it refuses a global or a TorchScript archive (torch
# 2.6-2.11: "Unsupported global: GLOBAL m.n", "Trying to load unsupported GLOBAL m.n whose module m
# is blocked", "Cannot use weights_only=True with TorchScript archives"), and this module's own
# refusals; not "Unsupported operand", which garbage bytes give as well (an invalid opcode)
_REFUSAL_MARKS = ("GLOBAL", "TorchScript", "UnsafeCheckpointError")


def refused_pickle(err: BaseException) -> bool:
    """Whether ``err`` (or, for torch DCP's ``CheckpointException``, one of the failures it gathers
    from the ranks) is a refusal to build something rather than damage: torch's ``weights_only``
    refusal of a global or a TorchScript archive, or an :class:`UnsafeCheckpointError`."""
    if isinstance(err, UnsafeCheckpointError):
        return True
    nested = gathered_failures(err)
    if any(isinstance(e, UnsafeCheckpointError) for e in nested):
        return True
    text = " ".join([str(err), *map(str, nested)])
    return any(m in text for m in _REFUSAL_MARKS)


def dist_load_error(ckpt: Path, err: BaseException) -> BaseException:
    """What the GPU engine raises when megatron-core's ``dist_checkpointing.load`` of ``ckpt`` failed
    with ``err`` (any exception; torch DCP gathers every rank's read errors into a
    ``CheckpointException``, a ``BaseException``).

    Returns:
        the GPU out-of-memory error ``err`` is or carries (:func:`training.out_of_memory.
        out_of_memory_error`: the trainer stops with exit code 6 and keeps every checkpoint, where a
        checkpoint taken for damaged would be passed over for an older one that the same memory
        cannot load either); else :class:`UnsafeCheckpointError` for a refused pickle
        (:func:`refused_pickle`); else :class:`DamagedCheckpointError`, each naming ``ckpt``.
    """
    if (oom := out_of_memory_error(err)) is not None:
        return oom
    if refused_pickle(err):
        return UnsafeCheckpointError(
            f"{ckpt}: megatron-core's dist_checkpointing.load met a pickle that is not data "
            f"({describe_load_error(err)}); it may run code when unpickled: not loaded"
        )
    return DamagedCheckpointError(
        f"{ckpt} cannot be loaded by megatron-core's dist_checkpointing.load "
        f"({describe_load_error(err)}): a file is damaged, or it is not this model's checkpoint"
    )


class _SafePickle:
    """Stands for the ``pickle`` module inside torch DCP's ``filesystem`` module: ``load`` is the
    metadata allow-list unpickler, the rest is ``pickle``'s."""

    def __getattr__(self, name):
        return getattr(pickle, name)

    @staticmethod
    def load(f, *args, **kwargs):
        return _load_metadata(f, getattr(f, "name", "a torch_dist metadata file"))


@contextlib.contextmanager
def data_only_torch_load() -> Iterator[None]:
    """Inside the block, ``torch.load`` runs with ``weights_only=True`` whatever its caller asks
    (megatron-core's safe globals allowed) and torch DCP's ``FileSystemReader.read_metadata``
    unpickles with the allow-list of :data:`METADATA_GLOBALS`: megatron-core's
    ``dist_checkpointing.load`` then reads the checkpoint as data. Both are process-wide while the
    block runs (the trainer loads in its main thread; nothing else in the process unpickles then)
    and restored after it, also on error.

    Raises (from the loads inside): ``pickle.UnpicklingError`` (a ``weights_only`` refusal) or
    :class:`UnsafeCheckpointError` (a metadata file), which torch DCP wraps in its
    ``CheckpointException`` (a ``BaseException``); :func:`refused_pickle` tells them from damage.
    """
    import torch.distributed.checkpoint.filesystem as dcp_fs

    real = torch.load

    def load(f, *args, **kwargs):
        kwargs["weights_only"] = True
        with torch.serialization.safe_globals(_safe_globals()):
            return real(f, *args, **kwargs)

    with mock.patch.object(torch, "load", load), mock.patch.object(dcp_fs, "pickle", _SafePickle()):
        yield


def _safe_globals() -> list:
    try:
        from megatron.core.safe_globals import SAFE_GLOBALS
    except ImportError:  # megatron-core is a dependency; without it nothing loads torch_dist anyway
        return []
    return list(SAFE_GLOBALS)


def _inside(ckpt: Path, relative_path, where: str) -> Path:
    """``ckpt / relative_path``, resolved; :class:`UnsafeCheckpointError` (``where`` first) unless it
    is a relative path to a file inside ``ckpt``."""
    rel = Path(relative_path) if isinstance(relative_path, str) else None
    path = (ckpt / rel).resolve() if rel is not None and not rel.is_absolute() else None
    if path is None or ckpt.resolve() not in path.parents:
        raise UnsafeCheckpointError(
            f"{where} points outside the checkpoint directory ({relative_path!r}); not loaded"
        )
    return path


def _vet_object(ckpt: Path, key: str, info) -> None:
    """One ShardedObject's ``torch.save`` bytes, loaded with ``weights_only=True`` on ``meta``."""
    where = f"{ckpt}: the object {key!r}"
    if getattr(info, "transform_descriptors", None):
        raise UnsafeCheckpointError(
            f"{where} is stored with transforms {list(info.transform_descriptors)}, which this "
            "project does not write; it was not loaded"
        )
    if not (
        isinstance(info.relative_path, str)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in (info.offset, info.length))
    ):
        raise DamagedCheckpointError(f"{where} has a malformed storage entry in .metadata ({info!r})")
    path = _inside(ckpt, info.relative_path, where)
    try:
        size = path.stat().st_size
    except OSError as err:
        raise DamagedCheckpointError(f"{where} is in {path}, which cannot be read ({err})") from None
    if info.offset < 0 or info.length < 0 or info.offset + info.length > size:
        raise DamagedCheckpointError(
            f"{where} lies past the end of {path} (bytes {info.offset}+{info.length} of {size})"
        )
    try:
        with open(path, "rb") as f, torch.serialization.safe_globals(_safe_globals()):
            torch.load(
                io.BufferedReader(_Slice(f, info.offset, info.length)),
                map_location="meta",
                weights_only=True,
            )
    except Exception as err:  # torch's weights_only refusals, a truncated zip, garbage bytes, ...
        with open(path, "rb") as f:
            valid = _is_valid_pickle(_Slice(f, info.offset, info.length))
        if valid or refused_pickle(err):
            found = (line.strip() for line in str(err).splitlines())
            detail = next((line for line in found if any(m in line for m in _REFUSAL_MARKS)), None)
            detail = detail or describe_load_error(err)
            raise UnsafeCheckpointError(
                f"{where} is not data: torch.load(weights_only=True) refuses it ({detail}); this "
                "checkpoint may run code when unpickled: it was not loaded"
            ) from None
        raise DamagedCheckpointError(f"{where} does not deserialize ({describe_load_error(err)})") from None


def vet_torch_dist_checkpoint(ckpt: str | os.PathLike):
    """Read a torch_dist checkpoint's ``.metadata`` and every ShardedObject it lists as data
    (module docstring); return the ``Metadata``.

    Raises:
        UnsafeCheckpointError: a pickle references a global outside the allow-lists, an object is
            stored with a transform, an object or tensor points outside ``ckpt``, or ``ckpt`` holds per-rank
            ``__<rank>.metadata`` files (the message names file and key).
        DamagedCheckpointError: a file is missing, truncated or does not deserialize.
    """
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    ckpt = Path(ckpt)
    per_rank = sorted(p.name for p in ckpt.glob("__*.metadata"))
    if per_rank:  # torch DCP reads __<rank>.metadata when .metadata fails to load
        raise UnsafeCheckpointError(
            f"{ckpt} holds per-rank metadata files {per_rank[:3]}, which megatron-core does not write "
            "(torch DCP reads them when .metadata fails to load); it was not loaded"
        )
    meta = read_metadata(ckpt)
    objects = {k for k, m in meta.state_dict_metadata.items() if isinstance(m, BytesStorageMetadata)}
    storage = meta.storage_data or {}
    for index, info in storage.items():
        if getattr(index, "fqn", None) in objects:
            _vet_object(ckpt, index.fqn, info)
        else:  # a tensor's bytes: read with weights_only=True by DCP, but only from inside ckpt
            _inside(ckpt, info.relative_path, f"{ckpt}: the tensor {getattr(index, 'fqn', index)!r}")
    missing = objects - {getattr(i, "fqn", None) for i in storage}
    if missing:
        raise DamagedCheckpointError(
            f"{ckpt / '.metadata'} lists objects without storage: {sorted(missing)[:3]}"
        )
    return meta
