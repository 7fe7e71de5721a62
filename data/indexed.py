"""Write and verify megatron-core IndexedDataset files (``<prefix>.bin`` + ``<prefix>.idx``).

Writing goes through megatron-core's own ``IndexedDatasetBuilder`` (so the format is exactly what
``IndexedDataset`` reads) into temporary names, which are verified and then renamed into place:
an interrupted or failed write leaves no ``.bin``/``.idx`` behind.  :func:`verify_indexed_dataset`
checks a pair completely (megatron-core itself does not notice a truncated ``.bin``).

Token ids are stored as int32 (Llama-3 vocab 128256 > uint16 range).
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.errors import CorruptDatasetError, DataError, MissingInputError, VocabSizeError, make_dirs

_INDEX_HEADER = b"MMIDIDX\x00\x00"
_HEADER_BYTES = 9 + 8 + 1 + 8 + 8  # magic, version, dtype code, sequence count, document count
# megatron.core.datasets.indexed_dataset.DType codes
_DTYPE_CODES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
TOKEN_DTYPE = np.int32


def bin_path(prefix: str | os.PathLike) -> str:
    """``<prefix>.bin``."""
    return f"{os.fspath(prefix)}.bin"


def idx_path(prefix: str | os.PathLike) -> str:
    """``<prefix>.idx``."""
    return f"{os.fspath(prefix)}.idx"


@dataclass(frozen=True)
class IndexedSummary:
    """What :func:`verify_indexed_dataset` found.

    Attributes:
        num_documents: documents (= sequences; one sequence per document here).
        num_sequences: sequences in the index.
        num_tokens: total token ids in the .bin.
        dtype: numpy dtype of the token ids.
        max_token: largest id (only when a ``vocab_size`` check was requested, else -1).
        index_digest: :func:`index_digest` of the ``.idx`` (what megatron-core's cached sample
            indexes are built from).
    """

    num_documents: int
    num_sequences: int
    num_tokens: int
    dtype: np.dtype
    max_token: int = -1
    index_digest: str = ""


def index_digest(prefix: str | os.PathLike) -> str:
    """BLAKE2b-128 (32 hex characters) of ``<prefix>.idx``: the document and sequence lengths that
    megatron-core's document, sample and shuffle indexes are computed from. The ``.idx`` is a few
    bytes per document (12 per sequence, 8 per document), small beside the ``.bin``.

    Raises:
        MissingInputError (a FileNotFoundError): the file is missing.
    """
    path = idx_path(prefix)
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=16)).hexdigest()
    except FileNotFoundError:
        raise MissingInputError(f"indexed dataset file missing: {path}") from None


def verify_indexed_dataset(
    prefix: str | os.PathLike, *, vocab_size: int | None = None, expected_dtype: type | None = TOKEN_DTYPE
) -> IndexedSummary:
    """Check that ``<prefix>.idx`` is well formed and matches ``<prefix>.bin`` byte for byte.

    Checks: both files exist; header, version and dtype code; the .idx size equals what its counts
    imply; sequence pointers are the running sum of lengths; document indices run 0..num_sequences
    non-decreasing; the .bin size equals the total tokens times the item size; optionally every id
    lies in ``[0, vocab_size)`` (reads the whole .bin through a memory map).

    Args:
        prefix: path prefix without extension.
        vocab_size: if given, also check token ids against it.
        expected_dtype: required token dtype (int32), or None to accept any.

    Returns:
        :class:`IndexedSummary`.

    Raises:
        MissingInputError (a FileNotFoundError): a file is missing.
        CorruptDatasetError: any mismatch (message names the file and what is wrong).
        VocabSizeError: a token id >= ``vocab_size`` (or negative).
    """
    ip, bp = idx_path(prefix), bin_path(prefix)
    for p in (ip, bp):
        if not os.path.isfile(p):
            raise MissingInputError(
                f"indexed dataset file missing: {p} (prepare it first: `python -m data.prepare --input "
                f"FILES --output-prefix {prefix}`, README 'Your data'; the sample corpus: "
                "`python -m data.prepare --default`)"
            )
    idx_size = os.path.getsize(ip)
    if idx_size < _HEADER_BYTES:
        raise CorruptDatasetError(f"{ip} is truncated ({idx_size} bytes, header alone is {_HEADER_BYTES})")
    with open(ip, "rb") as f:
        header = f.read(_HEADER_BYTES)
    if header[:9] != _INDEX_HEADER:
        raise CorruptDatasetError(f"{ip} is not a megatron-core index (bad magic {header[:9]!r})")
    (version,) = struct.unpack("<Q", header[9:17])
    (code,) = struct.unpack("<B", header[17:18])
    n_seq, n_doc = struct.unpack("<QQ", header[18:34])
    if version != 1:
        raise CorruptDatasetError(f"{ip}: unsupported index version {version} (expected 1)")
    if code not in _DTYPE_CODES:
        raise CorruptDatasetError(f"{ip}: unknown dtype code {code}")
    dtype = np.dtype(_DTYPE_CODES[code])
    if expected_dtype is not None and dtype != np.dtype(expected_dtype):
        raise CorruptDatasetError(f"{ip}: tokens are {dtype}, expected {np.dtype(expected_dtype)}")
    expected_idx = _HEADER_BYTES + 4 * n_seq + 8 * n_seq + 8 * n_doc
    if idx_size != expected_idx:
        raise CorruptDatasetError(
            f"{ip} is {idx_size} bytes but its counts ({n_seq} sequences, {n_doc} document indices) "
            f"imply {expected_idx}: the index is truncated or corrupt"
        )
    if n_doc < 1:
        raise CorruptDatasetError(f"{ip}: document index is empty (needs at least the leading 0)")
    raw = np.memmap(ip, mode="r", dtype=np.uint8)
    lengths = np.frombuffer(raw, dtype=np.int32, count=n_seq, offset=_HEADER_BYTES)
    pointers = np.frombuffer(raw, dtype=np.int64, count=n_seq, offset=_HEADER_BYTES + 4 * n_seq)
    docs = np.frombuffer(raw, dtype=np.int64, count=n_doc, offset=_HEADER_BYTES + 12 * n_seq)
    if n_seq and lengths.min() <= 0:
        raise CorruptDatasetError(f"{ip}: a sequence has length {int(lengths.min())} (must be > 0)")
    lengths64 = lengths.astype(np.int64)
    expect_ptr = np.concatenate(([0], np.cumsum(lengths64)[:-1])) * dtype.itemsize if n_seq else lengths64
    if not np.array_equal(pointers, expect_ptr):
        raise CorruptDatasetError(f"{ip}: sequence pointers do not match sequence lengths")
    if docs[0] != 0 or docs[-1] != n_seq or np.any(np.diff(docs) < 0):
        raise CorruptDatasetError(f"{ip}: document indices must rise from 0 to {n_seq}")
    num_tokens = int(lengths64.sum())
    bin_size = os.path.getsize(bp)
    if bin_size != num_tokens * dtype.itemsize:
        raise CorruptDatasetError(
            f"{bp} is {bin_size} bytes but {ip} describes {num_tokens} tokens x {dtype.itemsize} bytes "
            f"= {num_tokens * dtype.itemsize}: the .bin is truncated or the .idx belongs to other data"
        )
    max_token = -1
    if vocab_size is not None and num_tokens:
        tokens = np.memmap(bp, mode="r", dtype=dtype)
        lo, max_token = int(tokens.min()), int(tokens.max())
        del tokens
        if lo < 0 or max_token >= vocab_size:
            raise VocabSizeError(
                f"{bp} holds token ids in [{lo}, {max_token}] but the vocabulary has {vocab_size} ids: "
                "the data was tokenized with a different (larger) tokenizer than the model's, or the "
                ".bin is damaged (a flipped bit, a bad copy): prepare it again (python -m data.prepare)"
            )
    digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
    del raw
    return IndexedSummary(
        num_documents=n_doc - 1,
        num_sequences=n_seq,
        num_tokens=num_tokens,
        dtype=dtype,
        max_token=max_token,
        index_digest=digest,
    )


class IndexedDatasetWriter:
    """Stream documents into ``<prefix>.bin/.idx`` atomically (temp names, verify, rename).

    Use as a context manager; the files appear only if the block exits without an exception and
    :meth:`commit` (called by ``__exit__``) verifies them.  One document = one sequence.

    Example::

        with IndexedDatasetWriter("out/kjv") as w:
            w.add_document(np.array([128000, 9906, 128001], dtype=np.int32))
    """

    def __init__(self, prefix: str | os.PathLike, *, vocab_size: int | None = None):
        """Open temporary files next to ``prefix``.

        Args:
            prefix: output path prefix (parent directories are created).
            vocab_size: if given, every id must be in ``[0, vocab_size)``.

        Raises:
            MissingDependencyError: megatron-core is not installed.
        """
        from data.errors import import_megatron

        indexed = import_megatron(
            "megatron.core.datasets.indexed_dataset", "Writing megatron-core indexed datasets"
        )
        self.prefix = os.fspath(prefix)
        make_dirs(Path(self.prefix).parent, what="the output directory")
        tag = f".tmp-{os.getpid()}"
        self._tmp_prefix = self.prefix + tag
        self._builder = indexed.IndexedDatasetBuilder(bin_path(self._tmp_prefix), dtype=TOKEN_DTYPE)
        self._vocab_size = vocab_size
        self.num_documents = 0
        self.num_tokens = 0
        self._done = False
        self._summary: IndexedSummary | None = None

    def add_document(self, tokens) -> None:
        """Append one document.

        Args:
            tokens: 1-D sequence of ints (list / numpy array), length >= 1.

        Raises:
            DataError: empty document.
            VocabSizeError: an id outside ``[0, vocab_size)``.
        """
        arr = np.asarray(tokens, dtype=np.int64)
        if arr.ndim != 1 or arr.size == 0:
            raise DataError(f"a document must be a non-empty 1-D token list, got shape {arr.shape}")
        if self._vocab_size is not None and (arr.min() < 0 or arr.max() >= self._vocab_size):
            raise VocabSizeError(f"token id {int(arr.max())} outside the vocabulary of {self._vocab_size}")
        self._builder.add_document(arr.astype(TOKEN_DTYPE), [int(arr.size)])
        self.num_documents += 1
        self.num_tokens += int(arr.size)

    def finalize(self) -> IndexedSummary:
        """Write the index under the temporary name and verify the pair (nothing renamed yet).

        Returns:
            :class:`IndexedSummary` of the written dataset.

        Raises:
            DataError: no document was added, or the writer is already closed.
            CorruptDatasetError: verification failed.  On any error the temporary files are removed.
        """
        if self._done or self._summary is not None:
            raise DataError(f"{self.prefix}: writer already finalized or closed")
        try:
            if self.num_documents == 0:
                raise DataError(f"{self.prefix}: no documents to write (all were empty, invalid or skipped)")
            self._builder.finalize(idx_path(self._tmp_prefix))
            self._summary = verify_indexed_dataset(self._tmp_prefix, vocab_size=self._vocab_size)
            return self._summary
        except BaseException:
            self.abort()
            raise

    def publish(self) -> IndexedSummary:
        """Rename the finalized temporary pair to ``<prefix>.bin/.idx`` (``.bin`` first).

        Returns:
            the :class:`IndexedSummary` from :meth:`finalize`.

        Raises:
            DataError: :meth:`finalize` was not called (or failed).
        """
        if self._summary is None or self._done:
            raise DataError(f"{self.prefix}: finalize() must succeed before publish()")
        os.replace(bin_path(self._tmp_prefix), bin_path(self.prefix))
        os.replace(idx_path(self._tmp_prefix), idx_path(self.prefix))
        self._done = True
        return self._summary

    def commit(self) -> IndexedSummary:
        """:meth:`finalize` then :meth:`publish`; returns the :class:`IndexedSummary`."""
        self.finalize()
        return self.publish()

    def abort(self) -> None:
        """Close and delete the temporary files (idempotent; published files are left alone)."""
        self._done = True
        self._builder.data_file.close()
        for p in (bin_path(self._tmp_prefix), idx_path(self._tmp_prefix)):
            try:
                os.remove(p)
            except FileNotFoundError:
                pass

    def __enter__(self) -> IndexedDatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            if not self._done:
                if self._summary is None:
                    self.finalize()
                self.publish()
        elif not self._done:
            self.abort()


def remove_indexed_dataset(prefix: str | os.PathLike) -> None:
    """Delete ``<prefix>.bin`` and ``<prefix>.idx`` if present."""
    for p in (bin_path(prefix), idx_path(prefix)):
        try:
            os.remove(p)
        except FileNotFoundError:
            pass
