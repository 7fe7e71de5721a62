"""Fixtures for the data-pipeline tests.  No network: hub access is switched off, and every
output (prepared corpora, megatron index caches, datasets' Arrow cache) goes to pytest tmp dirs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import pytest


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Point the data cache away from <repo>/cache for the whole session."""
    old = os.environ.get("PRETRAIN_DATA_CACHE")
    os.environ["PRETRAIN_DATA_CACHE"] = str(tmp_path_factory.mktemp("data_cache"))
    yield
    if old is None:
        os.environ.pop("PRETRAIN_DATA_CACHE", None)
    else:
        os.environ["PRETRAIN_DATA_CACHE"] = old


@pytest.fixture(scope="session")
def llama3():
    from data.tokenizer import build_tokenizer

    return build_tokenizer("llama3")


DOCS = [
    "In the beginning God created the heaven and the earth.",
    "Hello, world! Ünïcödé text, emoji 🙂 and CJK 漢字 survive the round trip.",
    "def f(x):\n    return x * 2  # code with  double  spaces\n\n\n",
    "The <|begin_of_text|> marker inside a document is plain text, not a special token.",
    "Short.",
    "A longer paragraph. " * 40,
    'Numbers 1234567 and symbols ~!@#$%^&*()_+{}|:"<>?',
    "Last document of the tiny corpus.\nWith two lines.",
]


@pytest.fixture
def write_jsonl(tmp_path):
    """write_jsonl(texts, name="docs.jsonl", key="text") -> path of a JSON-lines file."""

    def _write(texts, name="docs.jsonl", key="text"):
        path = tmp_path / name
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({key: t}) + "\n" for t in texts)
        return path

    return _write


@pytest.fixture
def tiny_prefix(tmp_path, write_jsonl, llama3):
    """The DOCS corpus prepared unsplit: returns (prefix, PrepareResult)."""
    from data.preprocess import prepare_corpus
    from data.sources import DatasetsSource

    src = DatasetsSource(
        builder="json", data_files=[str(write_jsonl(DOCS))], name="tiny", cache_dir=str(tmp_path / "hf")
    )
    res = prepare_corpus(src, tmp_path / "out" / "tiny", tokenizer=llama3, progress=False, log=None)
    return res.prefixes["all"], res


@pytest.fixture(scope="session")
def default_corpus(tmp_path_factory):
    """The default corpus prepared once through the CLI: (cache_dir, CorpusBlend, stdout, seconds)."""
    from data.corpus import ensure_default_corpus
    from data.prepare import main

    cache = tmp_path_factory.mktemp("default_corpus")
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = main(["--default", "--cache-dir", str(cache), "--no-progress", "--workers", "2"])
    seconds = time.perf_counter() - t0
    assert rc == 0, out.getvalue()
    blend = ensure_default_corpus(cache, log=None)
    return cache, blend, out.getvalue(), seconds


def pytest_configure(config):
    # megatron-core's package import warns about optional training-side packages (TE, Apex, absl)
    # and about running without torch.distributed; neither matters to these tests.
    config.addinivalue_line("filterwarnings", "ignore::UserWarning:megatron")
