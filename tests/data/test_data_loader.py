"""Loading through megatron-core: round trip text -> .bin/.idx -> GPTDataset -> text, same seed ->
same order, resume from consumed samples, the sampler, and gloo process groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import DOCS

from data.errors import CorruptDatasetError, DataError, VocabSizeError
from data.indexed import bin_path
from data.loader import build_datasets, check_same_dataset, dataset_identity
from data.sampler import ConsumedSamplesSampler, build_dataloader

REPO = Path(__file__).resolve().parents[2]


def _build(prefix, tok, tmp_path, *, seq_length, samples, seed=1234, cache="ic"):
    return build_datasets(
        tokenizer=tok,
        seq_length=seq_length,
        seed=seed,
        train_samples=samples,
        prefixes=[prefix],
        split="1,0,0",
        index_cache_dir=tmp_path / cache,
    )


def _full(sample):
    """The seq_length + 1 tokens a sample was cut from (tokens, then the last label)."""
    return sample["tokens"].tolist() + [int(sample["labels"][-1])]


def test_round_trip_whole_corpus_in_one_sample(tiny_prefix, llama3, tmp_path):
    prefix, res = tiny_prefix
    ds = _build(prefix, llama3, tmp_path, seq_length=res.tokens - 1, samples=1).train
    assert len(ds) == 1
    sample = ds[0]
    assert sample["tokens"].shape == (res.tokens - 1,) and str(sample["tokens"].dtype) == "torch.int64"
    order = [int(d) for d in ds.document_index]
    assert sorted(order) == list(range(len(DOCS)))
    text = llama3.decode(_full(sample))
    assert text == "".join(f"<|begin_of_text|>{DOCS[d]}<|end_of_text|>" for d in order)
    assert sample["labels"].tolist() == _full(sample)[1:]
    assert sample["loss_mask"].tolist() == [1.0] * (res.tokens - 1)


def test_round_trip_every_sample_is_a_source_slice(tiny_prefix, llama3, tmp_path):
    prefix, res = tiny_prefix
    seq = 16
    n = (res.tokens - 1) // seq
    ds = _build(prefix, llama3, tmp_path, seq_length=seq, samples=n).train
    stream = [t for d in ds.document_index for t in llama3.encode_document(DOCS[int(d)])]
    stream_text = llama3.decode(stream)
    clean = 0
    for i in range(len(ds)):
        j = int(ds.shuffle_index[i])
        full = _full(ds[i])
        assert full == stream[j * seq : j * seq + seq + 1]
        text = llama3.decode(full)
        if "\ufffd" not in text:  # a sample cut inside a multi-byte character decodes with U+FFFD
            assert text in stream_text
            clean += 1
    assert clean >= len(ds) - 4


def test_same_seed_same_order(tiny_prefix, llama3, tmp_path):
    prefix, res = tiny_prefix
    n = (res.tokens - 1) // 8
    a = _build(prefix, llama3, tmp_path, seq_length=8, samples=n, seed=7, cache="a").train
    b = _build(
        prefix, llama3, tmp_path, seq_length=8, samples=n, seed=7, cache="b"
    ).train  # rebuilt from scratch
    c = _build(prefix, llama3, tmp_path, seq_length=8, samples=n, seed=8, cache="c").train
    seq_a = [_full(a[i]) for i in range(len(a))]
    assert seq_a == [_full(b[i]) for i in range(len(b))]
    assert seq_a != [_full(c[i]) for i in range(len(c))]
    assert dataset_identity(a) == dataset_identity(b) != dataset_identity(c)


def test_resume_from_consumed_samples(tiny_prefix, llama3, tmp_path):
    prefix, res = tiny_prefix
    n = (res.tokens - 1) // 8
    mbs, dp, steps_done = 2, 2, 3
    ds = _build(prefix, llama3, tmp_path, seq_length=8, samples=n).train

    def run(dataset, consumed, rank):
        return [
            b["tokens"].tolist()
            for b in build_dataloader(
                dataset,
                consumed_samples=consumed,
                micro_batch_size=mbs,
                data_parallel_rank=rank,
                data_parallel_size=dp,
            )
        ]

    resumed_ds = _build(
        prefix, llama3, tmp_path, seq_length=8, samples=n
    ).train  # a fresh process would do this
    check_same_dataset(dataset_identity(ds), resumed_ds)
    consumed = steps_done * mbs * dp
    for rank in range(dp):
        full = run(ds, 0, rank)
        assert len(full) == n // (mbs * dp)
        assert run(resumed_ds, consumed, rank) == full[steps_done:]
    # sample N+1 of an uninterrupted pass is the first one after skipping N
    first = next(
        iter(
            ConsumedSamplesSampler(
                total_samples=len(ds),
                consumed_samples=consumed,
                micro_batch_size=1,
                data_parallel_rank=0,
                data_parallel_size=1,
            )
        )
    )
    assert first == [consumed]
    other = _build(prefix, llama3, tmp_path, seq_length=8, samples=n - 1).train
    with pytest.raises(DataError, match="same blend, seed"):
        check_same_dataset(dataset_identity(ds), other)


def test_sampler_follows_megatron():
    s = ConsumedSamplesSampler(
        total_samples=10, consumed_samples=1, micro_batch_size=2, data_parallel_rank=1, data_parallel_size=2
    )
    assert list(s) == [[3, 4], [7, 8]] and len(s) == 2
    s = ConsumedSamplesSampler(
        total_samples=10,
        consumed_samples=1,
        micro_batch_size=2,
        data_parallel_rank=0,
        data_parallel_size=2,
        drop_last=False,
    )
    assert list(s) == [[1, 2], [5, 6], [9]] and len(s) == 3
    bad = [
        dict(total_samples=10, consumed_samples=10),
        dict(total_samples=0, consumed_samples=0),
        dict(total_samples=10, consumed_samples=0, micro_batch_size=0),
        dict(total_samples=10, consumed_samples=0, data_parallel_rank=2),
    ]
    for kw in bad:
        args = dict(micro_batch_size=1, data_parallel_rank=0, data_parallel_size=2) | kw
        with pytest.raises(DataError):
            ConsumedSamplesSampler(**args)


def test_bad_data_is_caught_before_megatron(tiny_prefix, llama3, tmp_path):
    prefix, res = tiny_prefix
    with pytest.raises(VocabSizeError):
        _ = build_datasets(
            tokenizer=llama3,
            seq_length=8,
            seed=1,
            train_samples=4,
            prefixes=[prefix],
            split="1,0,0",
            model_vocab_size=1000,
            index_cache_dir=tmp_path,
        )
    with open(bin_path(prefix), "r+b") as f:
        f.truncate(os.path.getsize(bin_path(prefix)) - 8)
    with pytest.raises(CorruptDatasetError, match="truncated"):
        _build(prefix, llama3, tmp_path, seq_length=8, samples=4)
    absent = tmp_path / "absent"
    with pytest.raises(FileNotFoundError, match=f"data.prepare --input FILES --output-prefix {absent}`"):
        _build(str(absent), llama3, tmp_path, seq_length=8, samples=4)


def test_argument_errors(tiny_prefix, llama3):
    prefix, _ = tiny_prefix
    common = dict(tokenizer=llama3, seq_length=8, seed=1, train_samples=4)
    with pytest.raises(DataError, match="exactly one"):
        build_datasets(**common)
    with pytest.raises(DataError, match="split string"):
        build_datasets(prefixes=[prefix], **common)
    with pytest.raises(DataError, match="one positive weight per prefix"):
        build_datasets(prefixes=[prefix], weights=[1, 2], split="1", **common)
    with pytest.raises(DataError, match="seq_length"):
        build_datasets(**(common | {"seq_length": 0}), prefixes=[prefix], split="1")


def test_gloo_process_group_matches_single_process(tiny_prefix, llama3, tmp_path):
    prefix, res = tiny_prefix
    n = (res.tokens - 1) // 8
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, sys, torch.distributed as dist
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=rank, world_size=2)
        from data.tokenizer import build_tokenizer
        from data.loader import build_datasets
        ds = build_datasets(tokenizer=build_tokenizer("llama3"), seq_length=8, seed=1234, train_samples={n},
                            prefixes=[{prefix!r}], split="1,0,0",
                            index_cache_dir="{tmp_path}/dist_cache").train
        out = [ds[i]["tokens"].tolist() for i in range(len(ds))]
        json.dump(out, open("{tmp_path}/rank%d.json" % rank, "w"))
        dist.barrier()
        dist.destroy_process_group()
    """)
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r)], env=env, stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    ref = _build(prefix, llama3, tmp_path, seq_length=8, samples=n).train
    expect = [ref[i]["tokens"].tolist() for i in range(len(ref))]
    for r in range(2):
        assert json.load(open(tmp_path / f"rank{r}.json")) == expect


def test_a_split_part_without_sequences_is_refused_not_built(tiny_prefix, llama3, tmp_path):
    # megatron-core 0.19.2 builds every part of a split with a weight above 0 and loops forever on one
    # without tokens (GPTDataset._get_num_epochs): the tiny corpus has 8 documents, so the test part of
    # 60,30,1 (round(8 * 90 / 91) = round(8 * 91 / 91) = 8) would hang the job; refused before megatron
    prefix, _ = tiny_prefix

    def build(split):
        return build_datasets(
            tokenizer=llama3,
            seq_length=8,
            seed=1,
            train_samples=4,
            valid_samples=1,
            test_samples=0,
            prefixes=[prefix],
            weights=[1.0],
            split=split,
            index_cache_dir=tmp_path / "ic",
        )

    none = r"split '60,30,1' gives the test part none of the 8 documents \(indexed sequences\)"
    with pytest.raises(DataError, match=none):
        build("60,30,1")
    splits = build("60,30,0")  # the same data with that part's weight 0 builds
    assert len(splits.train) >= 4 and len(splits.valid) >= 1 and splits.test is None


def test_a_corpus_prepared_again_at_the_same_prefix_gets_new_indexes(tmp_path, write_jsonl, llama3):
    """Found in review (2026-12-06): megatron-core keys its index cache (and the dataset identity) on
    the prefix path, so a corpus prepared again at the same prefix loaded the first one's cached
    document and sample indexes: an IndexError in the first step, or samples cut at the old offsets.
    The cache now sits in a subdirectory named by the .idx files' digest."""
    from data.preprocess import prepare_corpus
    from data.sources import DatasetsSource

    def prepare(texts, name):
        src = DatasetsSource(
            builder="json",
            data_files=[str(write_jsonl(texts, name=name))],
            name="c",
            cache_dir=str(tmp_path / f"hf-{name}"),
        )
        return prepare_corpus(src, tmp_path / "out" / "c", tokenizer=llama3, progress=False, log=None)

    first = prepare(DOCS, "a.jsonl")
    prefix = first.prefixes["all"]
    a = _build(prefix, llama3, tmp_path, seq_length=16, samples=40)
    texts = [d.upper() for d in DOCS[:3]] + ["Another text. " * 30]
    second = prepare(texts, "b.jsonl")
    assert second.prefixes["all"] == prefix and second.tokens != first.tokens
    b = _build(prefix, llama3, tmp_path, seq_length=16, samples=40)
    assert dataset_identity(a.train) == dataset_identity(b.train)  # megatron-core's: the path
    assert a.content != b.content and len(a.content) == len(b.content) == 32
    caches = sorted(p.name for p in (tmp_path / "ic").iterdir())
    assert caches == sorted(f"corpus-{c[:16]}" for c in (a.content, b.content))
    stream = [t for d in b.train.document_index for t in llama3.encode_document(texts[int(d)])]
    for i in range(len(b.train)):  # every sample is a slice of the new corpus
        full = _full(b.train[i])
        assert any(stream[j : j + len(full)] == full for j in range(len(stream) - len(full) + 1)), i
    again = _build(prefix, llama3, tmp_path, seq_length=16, samples=40, cache="ic")
    assert again.content == b.content  # the same files: the same key, the cached indexes reused


@pytest.mark.parametrize("split", [None, "1,1,0"])
def test_data_prepared_with_another_tokenizer_is_refused(tmp_path, write_jsonl, llama3, split):
    """Found in review (2026-12-06): a corpus prepared with a 13-token HF tokenizer trained under the
    default Llama-3 one without a word. The manifest names the tokenizer; the loader compares it."""
    from data.preprocess import manifest_path, prepare_corpus
    from data.sources import DatasetsSource

    src = DatasetsSource(
        builder="json", data_files=[str(write_jsonl(DOCS))], name="t", cache_dir=str(tmp_path / "hf")
    )
    out = tmp_path / "out" / "t"
    res = prepare_corpus(src, out, tokenizer=llama3, split=split, progress=False, log=None)
    prefix = res.prefixes["all" if split is None else "train"]
    _build(prefix, llama3, tmp_path, seq_length=8, samples=4)  # its own tokenizer: accepted
    man = json.loads(Path(manifest_path(out)).read_text())
    man["settings"]["tokenizer"].update({"class": "HFTokenizer", "file_sha256": "ab12", "vocab_size": 13})
    Path(manifest_path(out)).write_text(json.dumps(man))
    with pytest.raises(DataError) as err:
        _build(prefix, llama3, tmp_path, seq_length=8, samples=4)
    assert str(err.value).startswith(
        f"{prefix} was prepared with another tokenizer than this run's (class 'HFTokenizer' there, "
        f"'Llama3Tokenizer' here; file_sha256 'ab12' there, "
    )
    assert "vocab_size 13 there, 128256 here): set data.tokenizer / data.tokenizer_path" in str(err.value)
    Path(manifest_path(out)).unlink()  # data without a manifest (Megatron-LM's tools): not checked
    _build(prefix, llama3, tmp_path, seq_length=8, samples=4)
