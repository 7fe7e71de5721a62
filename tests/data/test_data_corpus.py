"""The embedded default corpus (KJV + CPython stdlib): one command prepares it in well under a
minute, deterministically and idempotently, and it loads as a weighted megatron-core blend."""

from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest

from data.corpus import DEFAULT_WEIGHTS, ensure_default_corpus
from data.errors import DataError
from data.loader import build_datasets, dataset_identity
from data.manifest import file_sha256


def test_cli_prepares_default_corpus_under_a_minute(default_corpus):
    cache, blend, out, seconds = default_corpus
    assert seconds < 60, f"default corpus took {seconds:.1f} s"
    m = re.search(r"default corpus: (\d+) documents, (\d+) tokens, ([\d.]+) s", out)
    assert m, out
    assert int(m.group(1)) == blend.documents and int(m.group(2)) == blend.tokens
    assert re.search(r"kjv: 1189 documents, \d+ tokens .* in [\d.]+ s", out)
    assert re.search(r"stdlib: \d+ documents, \d+ tokens \(skipped \d+ empty, \d+ invalid\) in [\d.]+ s", out)


def test_default_corpus_content(default_corpus, llama3):
    cache, blend, _, _ = default_corpus
    kjv, stdlib = blend.results
    assert blend.names == ("kjv", "stdlib") and blend.weights == (
        DEFAULT_WEIGHTS["kjv"],
        DEFAULT_WEIGHTS["stdlib"],
    )
    assert kjv.documents == 1189 and 0.95e6 < kjv.tokens < 1.15e6
    assert stdlib.tokens > 3e6 and blend.tokens > 4e6
    assert set(blend.prefixes) == {"train", "valid", "test"}
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    train = IndexedDataset(blend.prefixes["train"][0])
    assert llama3.decode(train[0]).startswith("<|begin_of_text|>Genesis 1\n\nIn the beginning God created")
    texts = [
        llama3.decode(ds[i])
        for ds in (IndexedDataset(blend.prefixes[k][0]) for k in blend.prefixes)
        for i in range(len(ds))
    ]
    assert len(texts) == 1189
    assert all(t.startswith("<|begin_of_text|>") and t.endswith("<|end_of_text|>") for t in texts)
    assert sum("Jesus wept." in t for t in texts) == 1


def test_default_corpus_is_reused_and_deterministic(default_corpus, tmp_path):
    cache, blend, _, _ = default_corpus
    files = sorted(p + ext for ps in blend.prefixes.values() for p in ps for ext in (".bin", ".idx"))
    before = {f: (os.path.getmtime(f), file_sha256(f)) for f in files}
    t0 = time.perf_counter()
    again = ensure_default_corpus(cache, log=None)
    assert time.perf_counter() - t0 < 10
    assert all(r.reused for r in again.results) and again.prefixes == blend.prefixes
    assert {f: (os.path.getmtime(f), file_sha256(f)) for f in files} == before
    # a separate preparation of the KJV part (single worker) gives the same bytes
    from data.preprocess import prepare_corpus
    from data.sources import KJVSource
    from data.tokenizer import TokenizerSpec

    res = prepare_corpus(
        KJVSource(),
        tmp_path / "kjv",
        tokenizer=TokenizerSpec(kind="llama3"),
        split="98,1,1",
        split_seed=1234,
        workers=1,
        on_invalid="skip",
        progress=False,
        log=None,
    )
    for key, p in res.prefixes.items():
        assert file_sha256(p + ".bin") == file_sha256(os.path.join(cache, "default", f"kjv_{key}.bin"))


def test_default_corpus_loads_as_weighted_blend(default_corpus, llama3, tmp_path):
    cache, blend, _, _ = default_corpus
    kw = dict(tokenizer=llama3, seq_length=256, seed=1234, blend=blend, index_cache_dir=tmp_path / "ic")
    splits = build_datasets(train_samples=4000, valid_samples=64, test_samples=0, **kw)
    assert splits.test is None and len(splits.train) == 4000 and len(splits.valid) >= 64
    ids = np.asarray(splits.train.dataset_index)
    frac_kjv = float(np.mean(ids == 0))
    assert abs(frac_kjv - DEFAULT_WEIGHTS["kjv"]) < 0.01
    s = splits.train[123]
    assert s["tokens"].shape == (256,) and int(s["tokens"].max()) < llama3.vocab_size
    again = build_datasets(train_samples=4000, valid_samples=64, test_samples=0, **kw)
    assert dataset_identity(again.train) == dataset_identity(splits.train)
    # the files' digest covers every split of the blend, built or not: validation off (a key free to
    # change on resume) keeps it (found in review, 2026-12-06: it blocked the resume)
    no_valid = build_datasets(train_samples=4000, valid_samples=0, test_samples=0, **kw)
    assert no_valid.valid is None and no_valid.content == splits.content == again.content
    assert all(
        again.train[i]["tokens"].tolist() == splits.train[i]["tokens"].tolist() for i in (0, 1, 2, 3999)
    )
    with pytest.raises(DataError, match="already split"):
        build_datasets(train_samples=10, split="1,0,0", **kw)
    with pytest.raises(DataError, match="explicit sample counts"):
        build_datasets(train_samples=10, valid_samples=None, **kw)
