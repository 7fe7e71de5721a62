"""Preprocessing: datasets/file sources -> tokens -> .bin/.idx; splits; empty / non-UTF-8 policies;
all-or-nothing outputs; idempotent reuse; worker processes; the CLI."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import DOCS

from data.errors import DataError, DocumentError, VocabSizeError
from data.indexed import verify_indexed_dataset
from data.preprocess import assign_splits, load_complete, parse_split, prepare_corpus
from data.sources import DatasetsSource, FilesSource


def read_docs(prefix):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(prefix))
    return [ds[i].tolist() for i in range(len(ds))]


def outputs(dirpath):
    return sorted(f for f in os.listdir(dirpath) if not f.endswith(".lock")) if os.path.isdir(dirpath) else []


def test_jsonl_round_trip(tiny_prefix, llama3):
    prefix, res = tiny_prefix
    docs = read_docs(prefix)
    assert docs == [llama3.encode_document(t) for t in DOCS]
    assert [llama3.decode(d[1:-1]) for d in docs] == DOCS
    assert all(d[0] == 128000 and d[-1] == 128001 for d in docs)
    assert (res.documents, res.tokens) == (len(DOCS), sum(map(len, docs)))
    assert res.skipped_empty == res.skipped_invalid == 0
    man = json.load(open(res.manifest))
    assert set(man["files"]) == {"tiny.bin", "tiny.idx"}
    assert man["result"]["tokens"] == res.tokens


@pytest.mark.parametrize("builder,suffix", [("parquet", ".parquet"), ("text", ".txt")])
def test_other_datasets_formats(tmp_path, llama3, builder, suffix):
    path = tmp_path / f"docs{suffix}"
    if builder == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"body": DOCS[:3]}), path)
        src = DatasetsSource(
            builder="parquet", data_files=[str(path)], text_key="body", cache_dir=str(tmp_path / "hf")
        )
        expect = DOCS[:3]
    else:
        path.write_text("first line\nsecond line\n\nthird\n", encoding="utf-8")
        src = DatasetsSource(
            builder="text", data_files=[str(path)], sample_by="line", cache_dir=str(tmp_path / "hf")
        )
        expect = ["first line", "second line", "third"]
    res = prepare_corpus(src, tmp_path / "o" / "c", tokenizer=llama3, progress=False, log=None)
    assert [llama3.decode(d[1:-1]) for d in read_docs(res.prefixes["all"])] == expect
    assert res.skipped_empty == (1 if builder == "text" else 0)


def test_empty_documents_skipped_and_counted_or_error(tmp_path, write_jsonl, llama3):
    path = write_jsonl(["one", "", "   \n\t", "two", None])
    src = DatasetsSource(builder="json", data_files=[str(path)], cache_dir=str(tmp_path / "hf"))
    out = tmp_path / "o"
    with pytest.raises(DocumentError, match="is empty.*on_empty='skip'"):
        prepare_corpus(
            src, out / "c", tokenizer=llama3, on_empty="error", on_invalid="skip", progress=False, log=None
        )
    assert outputs(out) == []  # nothing half-written
    with pytest.raises(DocumentError, match="is invalid: not text \\(NoneType\\)"):
        prepare_corpus(
            src, out / "c", tokenizer=llama3, on_empty="skip", on_invalid="error", progress=False, log=None
        )
    assert outputs(out) == []
    res = prepare_corpus(
        src, out / "c", tokenizer=llama3, on_empty="skip", on_invalid="skip", progress=False, log=None
    )
    assert (res.documents, res.skipped_empty, res.skipped_invalid) == (2, 2, 1)
    assert [llama3.decode(d[1:-1]) for d in read_docs(res.prefixes["all"])] == ["one", "two"]
    assert outputs(out) == ["c.bin", "c.idx", "c.manifest.json"]


def test_non_utf8_documents(tmp_path, llama3):
    root = tmp_path / "src"
    root.mkdir()
    (root / "a.txt").write_bytes(b"plain ascii")
    (root / "b.txt").write_bytes("caf\xe9 latin-1".encode("latin-1"))
    (root / "c.txt").write_bytes("ünïcödé".encode())
    src = FilesSource(root=str(root), patterns=("*.txt",))
    out = tmp_path / "o"
    with pytest.raises(DocumentError, match="b.txt.*not UTF-8"):
        prepare_corpus(src, out / "f", tokenizer=llama3, on_invalid="error", progress=False, log=None)
    assert outputs(out) == []
    res = prepare_corpus(src, out / "f", tokenizer=llama3, on_invalid="skip", progress=False, log=None)
    assert (res.documents, res.skipped_invalid) == (2, 1)
    assert "b.txt: not UTF-8" in res.skipped_examples[0]
    assert [llama3.decode(d[1:-1]) for d in read_docs(res.prefixes["all"])] == ["plain ascii", "ünïcödé"]
    # JSON lines with a non-UTF-8 value: that document is counted (or rejected), not the file
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n{"text": "fine"}\n')
    jsrc = DatasetsSource(builder="json", data_files=[str(bad)], name="j", cache_dir=str(tmp_path / "hf"))
    with pytest.raises(DocumentError, match="j\\[1\\].*not UTF-8"):
        prepare_corpus(jsrc, out / "j", tokenizer=llama3, progress=False, log=None)
    assert not any(f.startswith("j") for f in outputs(out))
    res = prepare_corpus(jsrc, out / "j", tokenizer=llama3, on_invalid="skip", progress=False, log=None)
    assert (res.documents, res.skipped_invalid) == (2, 1)
    # the text builder decodes whole files: a bad byte is a clear error naming the file and the fix
    badtxt = tmp_path / "bad.txt"
    badtxt.write_bytes(b"ok\ncaf\xe9\n")
    with pytest.raises(DataError, match="bad.txt.*not valid UTF-8.*--files-root"):
        prepare_corpus(
            DatasetsSource(builder="text", data_files=[str(badtxt)], cache_dir=str(tmp_path / "hf")),
            out / "t",
            tokenizer=llama3,
            progress=False,
            log=None,
        )
    assert not any(f.startswith("t") for f in outputs(out))


def test_missing_inputs(tmp_path, llama3):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        DatasetsSource(builder="json", data_files=[str(tmp_path / "nope.jsonl")])
    with pytest.raises(FileNotFoundError):
        FilesSource(root=str(tmp_path / "nodir"))
    with pytest.raises(DataError, match="column 'body' not in"):
        p = tmp_path / "d.jsonl"
        p.write_text('{"text": "x"}\n')
        prepare_corpus(
            DatasetsSource(
                builder="json", data_files=[str(p)], text_key="body", cache_dir=str(tmp_path / "hf")
            ),
            tmp_path / "o" / "d",
            tokenizer=llama3,
            progress=False,
            log=None,
        )
    assert outputs(tmp_path / "o") == []


def test_vocab_too_large_writes_nothing(tiny_prefix, tmp_path, write_jsonl, llama3):
    src = DatasetsSource(builder="json", data_files=[str(write_jsonl(DOCS))], cache_dir=str(tmp_path / "hf"))
    with pytest.raises(VocabSizeError, match="128256 ids.*exceeds.*32000"):
        prepare_corpus(
            src, tmp_path / "v" / "c", tokenizer=llama3, model_vocab_size=32000, progress=False, log=None
        )
    assert outputs(tmp_path / "v") == []


def test_split_assignment():
    assert parse_split("98,1,1") == pytest.approx([0.98, 0.01, 0.01])
    assert parse_split("1") == [1.0, 0.0, 0.0]
    for bad in ("a,b", "-1,2", "0,0,0", "1,1,1,1"):
        with pytest.raises(DataError):
            parse_split(bad)
    a = assign_splits(1000, "90,5,5", seed=7)
    assert np.bincount(a, minlength=3).tolist() == [900, 50, 50]
    assert np.array_equal(a, assign_splits(1000, "90,5,5", seed=7))
    assert not np.array_equal(a, assign_splits(1000, "90,5,5", seed=8))
    with pytest.raises(DataError, match="gives the valid split no document"):
        assign_splits(10, "98,1,1", seed=0)


def test_split_outputs_and_workers_are_deterministic(tmp_path, llama3):
    texts = [f"Document number {i}. " + "word " * (i % 17) for i in range(60)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    results = []
    for workers in (1, 2):
        src = DatasetsSource(builder="json", data_files=[str(path)], cache_dir=str(tmp_path / "hf"))
        results.append(
            prepare_corpus(
                src,
                tmp_path / f"w{workers}" / "c",
                tokenizer=llama3,
                split="80,10,10",
                split_seed=3,
                workers=workers,
                progress=False,
                log=None,
            )
        )
    r1, r2 = results
    assert r1.documents_per_split == {"train": 48, "valid": 6, "test": 6}
    for key in ("train", "valid", "test"):
        for ext in (".bin", ".idx"):
            assert open(r1.prefixes[key] + ext, "rb").read() == open(r2.prefixes[key] + ext, "rb").read()
    assign = assign_splits(60, "80,10,10", 3)
    got = [llama3.decode(d[1:-1]) for d in read_docs(r1.prefixes["valid"])]
    assert got == [
        t for t, s in zip(texts, assign, strict=True) if s == 1
    ]  # source order kept within a split


def test_reuse_is_idempotent_and_verified(tiny_prefix, tmp_path, write_jsonl, llama3):
    prefix, first = tiny_prefix
    src = DatasetsSource(
        builder="json", data_files=[str(write_jsonl(DOCS))], name="tiny", cache_dir=str(tmp_path / "hf")
    )
    mtime = os.path.getmtime(prefix + ".bin")
    again = prepare_corpus(src, os.path.dirname(prefix) + "/tiny", tokenizer=llama3, progress=False, log=None)
    assert again.reused and (again.documents, again.tokens) == (first.documents, first.tokens)
    assert os.path.getmtime(prefix + ".bin") == mtime


def test_edited_output_is_not_reused(tiny_prefix, tmp_path, write_jsonl, llama3):
    prefix, first = tiny_prefix
    data = bytearray(open(prefix + ".bin", "rb").read())
    data[8] ^= 1  # same size, other content
    open(prefix + ".bin", "wb").write(bytes(data))
    assert load_complete(prefix) is None
    src = DatasetsSource(
        builder="json", data_files=[str(write_jsonl(DOCS))], name="tiny", cache_dir=str(tmp_path / "hf")
    )
    res = prepare_corpus(src, prefix, tokenizer=llama3, progress=False, log=None)
    assert not res.reused
    assert read_docs(prefix) == [llama3.encode_document(t) for t in DOCS]


def test_failed_rerun_keeps_previous_complete_output(tiny_prefix, tmp_path, write_jsonl, llama3):
    prefix, first = tiny_prefix
    src = DatasetsSource(
        builder="json",
        data_files=[str(write_jsonl(DOCS + [""], name="more.jsonl"))],
        name="tiny",
        cache_dir=str(tmp_path / "hf"),
    )
    with pytest.raises(DocumentError):
        prepare_corpus(src, prefix, tokenizer=llama3, on_empty="error", progress=False, log=None)
    assert load_complete(prefix) is not None  # the old output is untouched and still verifies
    assert not [f for f in os.listdir(os.path.dirname(prefix)) if ".tmp-" in f]


def test_cli_prepares_a_jsonl_file(tmp_path, write_jsonl, capsys):
    from data.prepare import main

    path = write_jsonl(DOCS)
    assert (
        main(
            [
                "--input",
                str(path),
                "--output-prefix",
                str(tmp_path / "cli" / "docs"),
                "--workers",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"docs: {len(DOCS)} documents," in out and "tokens" in out and " s" in out
    verify_indexed_dataset(tmp_path / "cli" / "docs", vocab_size=128256)
    assert main(["--input", str(tmp_path / "missing.jsonl"), "--output-prefix", str(tmp_path / "x")]) == 2
    assert "data file not found" in capsys.readouterr().err
    assert main(["--input", str(path), "--output-prefix", str(tmp_path / "y"), "--split", "nope"]) == 2
    assert "split" in capsys.readouterr().err
