"""Indexed-dataset writing and verification: truncated .bin, mismatched / truncated .idx, ids out
of vocabulary, and atomic writes."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from data.errors import CorruptDatasetError, DataError, VocabSizeError
from data.indexed import IndexedDatasetWriter, bin_path, idx_path, verify_indexed_dataset


def _write(prefix, docs, vocab_size=None):
    with IndexedDatasetWriter(prefix, vocab_size=vocab_size) as w:
        for d in docs:
            w.add_document(np.asarray(d, dtype=np.int32))
    return prefix


def test_written_files_are_read_by_megatron(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    docs = [[128000, 1, 2, 128001], [128000, 5, 128001], [128000, 127999, 3, 4, 5, 128001]]
    prefix = _write(str(tmp_path / "a"), docs, vocab_size=128256)
    s = verify_indexed_dataset(prefix, vocab_size=128256)
    assert (s.num_documents, s.num_tokens, s.dtype, s.max_token) == (3, 13, np.int32, 128001)
    ds = IndexedDataset(prefix)
    assert [ds[i].tolist() for i in range(len(ds))] == docs
    assert ds[0].dtype == np.int32
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "a.idx"]


def test_truncated_bin(tmp_path):
    prefix = _write(str(tmp_path / "a"), [[1, 2, 3], [4, 5]])
    with open(bin_path(prefix), "r+b") as f:
        f.truncate(os.path.getsize(bin_path(prefix)) - 4)
    with pytest.raises(CorruptDatasetError, match="truncated"):
        verify_indexed_dataset(prefix)


def test_idx_of_other_data(tmp_path):
    a = _write(str(tmp_path / "a"), [[1, 2, 3], [4, 5]])
    b = _write(str(tmp_path / "b"), [[1, 2, 3, 4, 5, 6]])
    shutil.copy(idx_path(b), idx_path(a))
    with pytest.raises(CorruptDatasetError, match="other data|truncated"):
        verify_indexed_dataset(a)
    # same token count, other document layout: sizes agree, so only a manifest hash can tell
    # (see test_data_preprocess.py::test_edited_output_is_not_reused)
    c = _write(str(tmp_path / "c"), [[7, 8], [9, 10, 11]])
    shutil.copy(idx_path(c), idx_path(a))
    assert verify_indexed_dataset(a).num_tokens == 5


def test_truncated_or_garbled_idx(tmp_path):
    prefix = _write(str(tmp_path / "a"), [[1, 2, 3], [4, 5]])
    raw = open(idx_path(prefix), "rb").read()
    open(idx_path(prefix), "wb").write(raw[:-3])
    with pytest.raises(CorruptDatasetError, match="truncated or corrupt"):
        verify_indexed_dataset(prefix)
    open(idx_path(prefix), "wb").write(b"NOTANIDX\x00" + raw[9:])
    with pytest.raises(CorruptDatasetError, match="bad magic"):
        verify_indexed_dataset(prefix)
    open(idx_path(prefix), "wb").write(raw[:20])
    with pytest.raises(CorruptDatasetError, match="truncated"):
        verify_indexed_dataset(prefix)
    garbled = bytearray(raw)
    garbled[34 + 8 + 8] ^= 0xFF  # corrupt the second sequence pointer
    open(idx_path(prefix), "wb").write(bytes(garbled))
    with pytest.raises(CorruptDatasetError, match="pointers"):
        verify_indexed_dataset(prefix)


def test_missing_files(tmp_path):
    prefix = _write(str(tmp_path / "a"), [[1, 2]])
    os.remove(bin_path(prefix))
    with pytest.raises(FileNotFoundError, match="a.bin"):
        verify_indexed_dataset(prefix)


def test_ids_outside_vocabulary(tmp_path):
    prefix = _write(str(tmp_path / "a"), [[1, 2, 200_000]])
    with pytest.raises(VocabSizeError, match="different \\(larger\\) tokenizer"):
        verify_indexed_dataset(prefix, vocab_size=128256)
    with pytest.raises(VocabSizeError):
        _write(str(tmp_path / "b"), [[1, 2, 200_000]], vocab_size=128256)
    assert not [f for f in os.listdir(tmp_path) if f.startswith("b")]


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), IndexedDatasetWriter(str(tmp_path / "x")) as w:
        w.add_document([1, 2, 3])
        raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []
    with pytest.raises(DataError, match="no documents"), IndexedDatasetWriter(str(tmp_path / "y")):
        pass
    assert os.listdir(tmp_path) == []
    with pytest.raises(DataError, match="non-empty"):
        IndexedDatasetWriter(str(tmp_path / "z")).add_document([])
