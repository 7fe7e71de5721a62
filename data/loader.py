"""Loading: megatron-core ``GPTDataset`` splits built through ``BlendedMegatronDatasetBuilder``.

Works on CPU, without ``torch.distributed`` and under any initialized process group (gloo or
NCCL): megatron-core then builds the index caches on rank 0 first, behind a barrier, and the
other ranks load them.  No CUDA is touched.

Resume is exact only if the datasets are rebuilt identically: same blend (prefixes, weights), seed,
sequence length, split and numbers of samples (``num_samples`` is part of megatron-core's index
cache key).  Store :func:`dataset_identity` of the train dataset with ``consumed_samples`` in the
checkpoint and compare it on resume (:func:`check_same_dataset`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from data.corpus import CorpusBlend, default_cache_dir
from data.errors import DataError, import_megatron, make_dirs
from data.indexed import index_digest, verify_indexed_dataset
from data.tokenizer import Tokenizer, check_vocab_fits


class DatasetSplits(NamedTuple):
    """train / valid / test datasets (GPTDataset or BlendedDataset; None where not built), and
    ``content``: :func:`content_key` of the prefixes they were built from."""

    train: object
    valid: object
    test: object
    content: str = ""


def content_key(digests: dict[str, str]) -> str:
    """One BLAKE2b-128 hex digest of ``{prefix: data.indexed.index_digest(prefix)}``: equal keys mean
    the same files at the same prefixes, as far as megatron-core's sample indexes can tell.

    megatron-core keys its index cache and :func:`dataset_identity` on the prefixes' paths, not on
    what the files hold: a corpus prepared again at the same prefix (more documents, other text)
    loaded the old cached indexes (found in review, 2026-12-06: an ``IndexError`` in the first step,
    or, where the shapes happened to fit, samples cut from the wrong offsets).
    """
    h = hashlib.blake2b(digest_size=16)
    for prefix in sorted(digests):
        h.update(f"{prefix}\0{digests[prefix]}\n".encode())
    return h.hexdigest()


def _digest_if_present(prefix: str) -> str:
    """:func:`data.indexed.index_digest` of ``prefix``, or ``"absent"`` for a split prefix of a blend
    that is not built and has no files."""
    try:
        return index_digest(prefix)
    except FileNotFoundError:
        return "absent"


def _check_samples(name: str, value: int | None, *, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise DataError(f"{name} must be an int >= 0{' or None' if allow_none else ''}, got {value!r}")


def build_datasets(
    *,
    tokenizer: Tokenizer,
    seq_length: int,
    seed: int,
    train_samples: int,
    valid_samples: int | None = 0,
    test_samples: int | None = 0,
    blend: CorpusBlend | None = None,
    prefixes: Sequence[str] | None = None,
    weights: Sequence[float] | None = None,
    split: str | None = None,
    index_cache_dir: str | os.PathLike | None = None,
    model_vocab_size: int | None = None,
    verify: bool = True,
    reset_position_ids: bool = False,
    reset_attention_mask: bool = False,
    eod_mask_loss: bool = False,
    create_attention_mask: bool = False,
    add_extra_token_to_sequence: bool = True,
    is_built_on_rank: Callable[[], bool] | None = None,
    num_dataset_builder_threads: int = 1,
    mid_level_dataset_surplus: float = 0.005,
) -> DatasetSplits:
    """Build train/valid/test datasets with megatron-core (``GPTDatasetConfig`` + builder).

    Give either ``blend`` (corpora already split at preprocessing, e.g. from
    :func:`data.corpus.ensure_default_corpus`; megatron's ``blend_per_split``) or ``prefixes`` (+
    optional ``weights``) with a Megatron ``split`` string such as ``"969,30,1"`` (megatron splits
    each dataset's documents into contiguous ranges).

    Each sample (``dataset[i]``) is a dict of torch tensors: ``tokens`` and ``labels`` int64
    ``[seq_length]`` (labels = tokens shifted by one), ``loss_mask`` float32 ``[seq_length]``,
    ``position_ids`` int64 ``[seq_length]``, ``attention_mask`` bool ``[1, seq_length, seq_length]``
    only if ``create_attention_mask``, and ``dataset_id`` for blends.  Samples run across
    document boundaries (documents are ``<|begin_of_text|> ... <|end_of_text|>``).

    Args:
        tokenizer: the tokenizer the data was prepared with (its ``eod``/``pad``/``vocab_size`` are
            used, and it is part of the index-cache key).
        seq_length: tokens per sample.
        seed: megatron's ``random_seed`` (document and sample shuffling).
        train_samples: samples in the train dataset (``train_iters * global_batch_size``); > 0.
        valid_samples / test_samples: samples for those splits; 0 = do not build; None = one epoch
            (only for unweighted inputs).
        blend / prefixes / weights / split: the data, see above.
        index_cache_dir: where megatron-core caches its index .npy files (default
            ``<data cache>/index_cache``), in a subdirectory ``corpus-<16 hex>`` named by
            :func:`content_key` (a corpus prepared again at the same prefix gets new indexes); must
            be shared by all ranks of a node.
        model_vocab_size: if given, ``check_vocab_fits(tokenizer.vocab_size, model_vocab_size)``.
        verify: fully verify every .bin/.idx pair first (and that ids are < tokenizer.vocab_size),
            and that the prefixes' ``data.prepare`` manifests name this tokenizer
            (:func:`check_prepared_tokenizer`).
        reset_position_ids / reset_attention_mask / eod_mask_loss / create_attention_mask /
            add_extra_token_to_sequence: ``GPTDatasetConfig`` fields of the same names.
        is_built_on_rank: megatron's callable; default builds on every rank.
        num_dataset_builder_threads / mid_level_dataset_surplus: ``GPTDatasetConfig`` fields.

    Returns:
        :class:`DatasetSplits`.

    Raises:
        DataError: inconsistent arguments (both/neither of blend and prefixes, missing split, ...).
        MissingInputError / CorruptDatasetError: a missing, truncated or mismatched .bin/.idx.
        VocabSizeError: the tokenizer or the data does not fit the model's vocabulary.
        MissingDependencyError: megatron-core is not installed.
    """
    if (blend is None) == (prefixes is None):
        raise DataError("give exactly one of blend= (prepared CorpusBlend) or prefixes= (+ split=)")
    if not isinstance(seq_length, int) or seq_length <= 0:
        raise DataError(f"seq_length must be a positive int, got {seq_length!r}")
    _check_samples("train_samples", train_samples, allow_none=False)
    if train_samples == 0:
        raise DataError("train_samples must be > 0")
    _check_samples("valid_samples", valid_samples, allow_none=True)
    _check_samples("test_samples", test_samples, allow_none=True)
    if model_vocab_size is not None:
        check_vocab_fits(tokenizer.vocab_size, model_vocab_size)
    sizes = [train_samples, valid_samples, test_samples]

    if blend is not None:
        if split is not None or weights is not None:
            raise DataError(
                "blend= is already split and weighted at preprocessing; do not pass split=/weights="
            )
        if any(size is None for size in sizes):
            raise DataError(
                "a weighted blend needs explicit sample counts for every split (0 = not built), "
                f"got train/valid/test = {sizes}"
            )
        per_split = blend.blend_per_split()
        # the content key covers every split's prefixes, built or not: toggling validation (a key
        # free to change on resume) must not change it (found in review, 2026-12-06)
        content_prefixes = [p for b in per_split if b is not None for p in b[0]]
        for i, size in enumerate(sizes):
            if size == 0:
                per_split[i] = None
        if per_split[0] is None:
            raise DataError("the blend has no train split")
        all_prefixes = [p for b in per_split if b is not None for p in b[0]]
        config_data = {"blend_per_split": per_split}
    else:
        prefixes = [os.fspath(p) for p in prefixes]
        if not prefixes:
            raise DataError("prefixes is empty")
        if split is None:
            raise DataError("prefixes= needs a Megatron split string, e.g. split='969,30,1'")
        if weights is not None:
            weights = [float(w) for w in weights]
            if len(weights) != len(prefixes) or any(not w > 0 for w in weights):
                raise DataError(
                    f"need one positive weight per prefix, got {weights} for {len(prefixes)} prefixes"
                )
            if any(s is None for s in sizes):
                raise DataError("weighted blends need explicit sample counts for every split (not None)")
        from data.preprocess import parse_split

        parse_split(split)  # clear error for a malformed split before megatron asserts on it
        all_prefixes = content_prefixes = prefixes
        config_data = {"blend": (prefixes, weights), "split": split}

    if verify:
        summaries = {
            p: verify_indexed_dataset(p, vocab_size=tokenizer.vocab_size) for p in dict.fromkeys(all_prefixes)
        }
        if prefixes is not None:
            check_split_parts(summaries, split)
        check_prepared_tokenizer(all_prefixes, tokenizer)
    else:
        summaries = {}
    content = content_key(
        {
            p: summaries[p].index_digest if p in summaries else _digest_if_present(p)
            for p in dict.fromkeys(content_prefixes)
        }
    )

    gpt = import_megatron("megatron.core.datasets.gpt_dataset", "Loading GPT datasets")
    builder_mod = import_megatron(
        "megatron.core.datasets.blended_megatron_dataset_builder", "Loading GPT datasets"
    )
    cache = Path(index_cache_dir) if index_cache_dir is not None else default_cache_dir() / "index_cache"
    cache = cache / f"corpus-{content[:16]}"  # megatron-core's keys name the prefixes, not their content
    make_dirs(cache, what="the index cache directory")  # megatron-core's own error on this is generic
    config = gpt.GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        path_to_cache=str(cache),
        tokenizer=tokenizer,
        reset_position_ids=reset_position_ids,
        reset_attention_mask=reset_attention_mask,
        eod_mask_loss=eod_mask_loss,
        create_attention_mask=create_attention_mask,
        add_extra_token_to_sequence=add_extra_token_to_sequence,
        num_dataset_builder_threads=num_dataset_builder_threads,
        mid_level_dataset_surplus=mid_level_dataset_surplus,
        **config_data,
    )
    builder = builder_mod.BlendedMegatronDatasetBuilder(
        cls=gpt.GPTDataset, sizes=sizes, is_built_on_rank=is_built_on_rank or (lambda: True), config=config
    )
    train, valid, test = builder.build()
    return DatasetSplits(train, valid, test, content)


def check_split_parts(summaries: dict, split: str) -> None:
    """Raise :class:`DataError` if the Megatron ``split`` gives a part with a weight above 0 none of the
    sequences of a prefix (``summaries``: prefix -> :class:`~data.indexed.IndexedSummary`).

    megatron-core builds every part whose weight is above 0, also those asked for 0 samples (the test
    part here), and its ``GPTDataset._get_num_epochs`` (0.19.2) loops forever on a part without
    tokens: a small corpus with a split such as ``969,30,1`` hung the job at start-up. The parts are
    counted as megatron-core's builder counts them: ``round(end * n) - round(begin * n)`` sequences of
    the normalized split matrix.
    """
    cfg = import_megatron("megatron.core.datasets.blended_megatron_dataset_config", "Loading GPT datasets")
    matrix = cfg.convert_split_vector_to_split_matrix(cfg.parse_and_normalize_split(split))
    for prefix, summary in summaries.items():
        n = summary.num_sequences
        for name, part in zip(("train", "valid", "test"), matrix, strict=True):
            if part is not None and int(round(part[1] * n)) == int(round(part[0] * n)):
                raise DataError(
                    f"split {split!r} gives the {name} part none of the {n} documents (indexed sequences) "
                    f"of {prefix} (megatron-core would build it empty and never return): give that part "
                    "weight 0 in the split (data.split), or more data to the prefix"
                )


def prepared_manifest(prefix: str) -> dict | None:
    """The ``data.prepare`` manifest that wrote ``prefix`` (``<prefix>.manifest.json``, or for a split
    output ``<base>_train`` / ``_valid`` / ``_test`` the base's), None where there is none (data
    preprocessed by Megatron-LM's own tools, or a manifest that does not list this prefix)."""
    from data.manifest import read_manifest

    name = os.path.basename(prefix)
    candidates = [prefix]
    for part in ("_train", "_valid", "_test"):
        if prefix.endswith(part):
            candidates.append(prefix[: -len(part)])
    for base in candidates:
        man = read_manifest(f"{base}.manifest.json")
        if man is not None and name in (man.get("result") or {}).get("prefixes", {}).values():
            return man
    return None


TOKENIZER_FACTS = ("class", "file_sha256", "vocab_size")  # what makes two vocabularies one


def check_prepared_tokenizer(prefixes: Sequence[str], tokenizer: Tokenizer) -> None:
    """Raise :class:`DataError` where a prefix's ``data.prepare`` manifest records another tokenizer
    than ``tokenizer`` (its class, file sha256 or vocabulary size).

    Without it (found in review, 2026-12-06), data prepared with a smaller tokenizer trained under the
    default Llama-3 one: every id was below its vocabulary size, megatron-core's end-of-document id
    never occurred, and the run was spent on a model of nothing. Prefixes without a manifest are not
    checked (their token range still is, by :func:`data.indexed.verify_indexed_dataset`).
    """
    now = dict(tokenizer.unique_identifiers)
    for prefix in dict.fromkeys(prefixes):
        man = prepared_manifest(prefix)
        if man is None:
            continue
        then = (man.get("settings") or {}).get("tokenizer") or {}
        diffs = [
            f"{k} {then.get(k)!r} there, {now.get(k)!r} here"
            for k in TOKENIZER_FACTS
            if then.get(k) != now.get(k)
        ]
        if diffs:
            raise DataError(
                f"{prefix} was prepared with another tokenizer than this run's ({'; '.join(diffs)}): set "
                "data.tokenizer / data.tokenizer_path to the one it was prepared with, or prepare the "
                "corpus again with this one (python -m data.prepare --tokenizer ...)"
            )


def dataset_identity(dataset) -> str:
    """megatron-core's md5 of everything that defines ``dataset``'s sample order.

    It covers the class, prefixes, number of samples, split, seed, sequence length and tokenizer
    (and weights/size for blends).  Equal identities mean identical sample order.

    Args:
        dataset: a GPTDataset or BlendedDataset.

    Returns:
        32-char hex str.
    """
    return dataset.unique_description_hash


def check_same_dataset(saved_identity: str, dataset) -> None:
    """Raise unless ``dataset`` has the identity stored in the checkpoint (exact resume).

    Raises:
        DataError: the identities differ; the message lists what must match.
    """
    now = dataset_identity(dataset)
    if now != saved_identity:
        raise DataError(
            f"the dataset differs from the checkpoint's (identity {now} != {saved_identity}): resuming "
            "from consumed_samples would not continue with the next unseen sample. Rebuild with the same "
            "blend, seed, seq_length, split, number of samples and tokenizer."
        )
