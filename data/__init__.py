"""Data pipeline: real corpora and the real Llama-3 tokenizer into megatron-core indexed datasets.

Public API (imported lazily, so ``import data`` is cheap):

* :func:`build_tokenizer`, :func:`check_vocab_fits`, :func:`padded_vocab_size` - ``data.tokenizer``
* :func:`prepare_corpus`, :class:`PrepareResult` - ``data.preprocess``
* :class:`DatasetsSource`, :class:`FilesSource`, :class:`KJVSource`, :func:`stdlib_source` - ``data.sources``
* :func:`ensure_default_corpus`, :class:`CorpusBlend`, :func:`blend_prepared` - ``data.corpus``
* :func:`build_datasets`, :func:`dataset_identity`, :func:`check_same_dataset` - ``data.loader``
* :class:`ConsumedSamplesSampler`, :func:`build_dataloader` - ``data.sampler``
* :func:`verify_indexed_dataset` - ``data.indexed``

CLI: ``python -m data.prepare --default`` (see ``python -m data.prepare --help``).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "build_tokenizer": "data.tokenizer",
    "check_vocab_fits": "data.tokenizer",
    "padded_vocab_size": "data.tokenizer",
    "Tokenizer": "data.tokenizer",
    "TokenizerSpec": "data.tokenizer",
    "LLAMA3_VOCAB_SIZE": "data.tokenizer",
    "prepare_corpus": "data.preprocess",
    "PrepareResult": "data.preprocess",
    "DatasetsSource": "data.sources",
    "FilesSource": "data.sources",
    "KJVSource": "data.sources",
    "stdlib_source": "data.sources",
    "ensure_default_corpus": "data.corpus",
    "CorpusBlend": "data.corpus",
    "blend_prepared": "data.corpus",
    "default_cache_dir": "data.corpus",
    "build_datasets": "data.loader",
    "dataset_identity": "data.loader",
    "check_same_dataset": "data.loader",
    "ConsumedSamplesSampler": "data.sampler",
    "build_dataloader": "data.sampler",
    "verify_indexed_dataset": "data.indexed",
    "DataError": "data.errors",
    "DocumentError": "data.errors",
    "CorruptDatasetError": "data.errors",
    "VocabSizeError": "data.errors",
    "MissingDependencyError": "data.errors",
    "MissingInputError": "data.errors",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'data' has no attribute {name!r}")
