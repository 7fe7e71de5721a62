"""The job's data: tokenizer, corpus blend, megatron-core GPTDatasets and consumed-samples loaders.

* ``data.corpus: default`` -> :func:`data.ensure_default_corpus` (prepared on first use into the
  data cache, then reused); its train/valid splits are the blend's per-split prefixes.
* a list of ``{prefix, weight}`` -> megatron's ``blend`` with the Megatron ``data.split``.

The train dataset holds ``train_iters * global_batch_size`` samples (part of megatron's index-cache
key and of :func:`data.dataset_identity`); validation uses the first ``validation.iters *
global_batch_size`` samples of the held-out split, the same ones at every evaluation. Resume is
exact because the loader starts at ``consumed_samples`` of an identically rebuilt dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DataBundle", "build_data", "micro_batches", "validation_micro_batches"]


@dataclass
class DataBundle:
    train: object
    valid: object | None
    identity: str
    describe: str
    content: str | None = None  # data.loader.content_key of the prepared files


def build_data(cfg, *, model_vocab_size: int, log=print) -> DataBundle:
    """Build the datasets of ``cfg`` (every rank; megatron-core builds index caches on rank 0 first)."""
    from data import (
        build_datasets,
        build_tokenizer,
        dataset_identity,
        default_cache_dir,
        ensure_default_corpus,
    )

    d = cfg.data
    cache = Path(d.cache_dir) if d.cache_dir else default_cache_dir()
    tokenizer = build_tokenizer(d.tokenizer, d.tokenizer_path)
    train_samples = cfg.train_iters * cfg.training.global_batch_size
    valid_samples = cfg.validation.iters * cfg.training.global_batch_size if cfg.validation.interval else 0
    common = dict(
        tokenizer=tokenizer,
        seq_length=d.seq_length,
        seed=d.seed,
        train_samples=train_samples,
        valid_samples=valid_samples,
        test_samples=0,
        index_cache_dir=cache / "index_cache",
        model_vocab_size=model_vocab_size,
    )
    if d.corpus == "default":
        blend = ensure_default_corpus(cache, log=log)
        splits = build_datasets(blend=blend, **common)
        describe = (
            f"default corpus ({', '.join(f'{n} {w:g}' for n, w in zip(blend.names, blend.weights))}; "
            f"{blend.tokens:,} tokens) in {cache}"
        )
        wanted = train_samples * d.seq_length
        if wanted > blend.tokens:  # a sample corpus for trials, not for a real run
            log(
                f"data: warning: {wanted:,} training tokens are {wanted / blend.tokens:,.1f} passes over the "
                f"embedded default corpus ({blend.tokens:,} tokens); for pretraining set data.corpus to "
                "your prepared corpus (README, Your data)"
            )
    else:
        splits = build_datasets(
            prefixes=[c["prefix"] for c in d.corpus],
            weights=[c["weight"] for c in d.corpus],
            split=d.split,
            **common,
        )
        describe = f"{len(d.corpus)} prefixes, split {d.split}"
    return DataBundle(
        train=splits.train,
        valid=splits.valid,
        identity=dataset_identity(splits.train),
        describe=describe,
        content=splits.content,
    )


def _loader(dataset, cfg, consumed: int, dp_rank: int, dp_size: int):
    from data import build_dataloader

    return build_dataloader(
        dataset,
        consumed_samples=consumed,
        micro_batch_size=cfg.training.micro_batch_size,
        data_parallel_rank=dp_rank,
        data_parallel_size=dp_size,
        num_workers=cfg.data.num_workers,
    )


def micro_batches(
    bundle: DataBundle, cfg, *, consumed_samples: int, dp_rank: int, dp_size: int
) -> Iterator[dict]:
    """This rank's training micro-batches from global sample ``consumed_samples`` on."""
    return iter(_loader(bundle.train, cfg, consumed_samples, dp_rank, dp_size))


def validation_micro_batches(bundle: DataBundle, cfg, *, dp_rank: int, dp_size: int) -> list[dict]:
    """This rank's micro-batches of the fixed validation set (``validation.iters`` global batches)."""
    if bundle.valid is None:
        return []
    per_rank = (
        cfg.validation.iters * cfg.training.global_batch_size // (cfg.training.micro_batch_size * dp_size)
    )
    out = []
    for i, mb in enumerate(_loader(bundle.valid, cfg, 0, dp_rank, dp_size)):
        if i >= per_rank:
            break
        out.append(mb)
    return out
