"""The Llama-3 tokenizer (check values, framing, fidelity to Meta's reference), HF directories,
and the vocabulary-size check."""

from __future__ import annotations

import importlib.util
import sysconfig
from pathlib import Path

import pytest

from data.errors import DataError, MissingDependencyError, VocabSizeError
from data.tokenizer import (
    LLAMA3_VOCAB_SIZE,
    TokenizerSpec,
    build_tokenizer,
    check_vocab_fits,
    padded_vocab_size,
)


def test_llama3_check_values(llama3):
    assert llama3.encode("Hello, world!") == [9906, 11, 1917, 0]
    assert llama3.vocab_size == LLAMA3_VOCAB_SIZE == 128256
    assert (llama3.bos, llama3.eos, llama3.eod, llama3.pad) == (128000, 128001, 128001, 128004)
    assert llama3.decode([9906, 11, 1917, 0]) == "Hello, world!"
    assert llama3.decode([128000]) == "<|begin_of_text|>"


def test_documents_get_bos_and_eos(llama3):
    ids = llama3.encode_document("Hello, world!")
    assert ids == [128000, 9906, 11, 1917, 0, 128001]
    no_bos = TokenizerSpec(kind="llama3", add_bos=False).build().encode_document("Hello, world!")
    assert no_bos == [9906, 11, 1917, 0, 128001]


def test_special_token_text_stays_plain_text(llama3):
    ids = llama3.encode("a <|begin_of_text|> b <|end_of_text|>")
    assert not set(ids) & {128000, 128001}
    assert llama3.decode(ids) == "a <|begin_of_text|> b <|end_of_text|>"


def test_matches_meta_reference_encoder(llama3):
    """Same ids as llama_models' own Tokenizer, including its 400k-char and 25k-run cutting."""
    from llama_models.llama3.tokenizer import Tokenizer as MetaTokenizer

    meta = MetaTokenizer.get_instance()
    topics = Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
    texts = [
        topics.read_text(encoding="utf-8"),  # > 400k characters
        "x" * 60_000 + " tail",  # a non-whitespace run > 25k
        "a" + " " * 30_000 + "b\n\n\tc",  # a whitespace run > 25k
        "Ünïcödé 🙂 漢字 \r\n mixed\u2028separators",
    ]
    assert len(texts[0]) > 400_000
    for t in texts:
        assert llama3.encode(t) == meta.encode(t, bos=False, eos=False)
        assert llama3.encode_document(t) == meta.encode(t, bos=True, eos=True)
        assert llama3.decode(llama3.encode(t)) == t


def test_missing_llama_models_names_the_fix(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llama_models" else real(name, *a)
    )
    with pytest.raises(MissingDependencyError, match="pip install --no-deps llama-models"):
        build_tokenizer("llama3")


def test_bad_tokenizer_inputs(tmp_path):
    with pytest.raises(DataError, match="unknown tokenizer kind"):
        build_tokenizer("sentencepiece")
    with pytest.raises(FileNotFoundError):
        build_tokenizer("llama3", tmp_path / "missing.model")
    with pytest.raises(FileNotFoundError, match="HF tokenizer directory not found"):
        build_tokenizer("hf", tmp_path / "nope")
    bad = tmp_path / "bad.model"
    bad.write_text("aGVsbG8= 0\nnot-a-valid-line\n")
    with pytest.raises(DataError, match="bad.model:2"):
        build_tokenizer("llama3", bad)
    small = tmp_path / "small.model"
    small.write_text("aGVsbG8= 0\n")
    with pytest.raises(DataError, match="exactly 128000"):
        build_tokenizer("llama3", small)


def make_hf_dir(path: Path, extra_words: int = 0) -> Path:
    """A small real HF fast tokenizer (WordLevel) saved with save_pretrained."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "<pad>", "hello", "world", "tiny", "corpus", ",", "!", "."]
    words += [f"w{i}" for i in range(extra_words)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(str(path))
    return path


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_hf_tokenizer_directory(tmp_path):
    tok = build_tokenizer("hf", make_hf_dir(tmp_path / "hf"))
    assert (tok.bos, tok.eos, tok.pad, tok.vocab_size) == (1, 2, 3, 11)
    assert tok.encode("hello , world !") == [4, 8, 5, 9]
    assert tok.encode_document("hello world") == [1, 4, 5, 2]
    assert tok.spec.build().encode("tiny corpus") == [6, 7]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_vocab_larger_than_embedding_is_rejected(tmp_path):
    tok = build_tokenizer("hf", make_hf_dir(tmp_path / "hf", extra_words=100))
    assert tok.vocab_size == 111
    with pytest.raises(VocabSizeError, match="exceeds the model's embedding"):
        check_vocab_fits(tok.vocab_size, 64)
    check_vocab_fits(tok.vocab_size, 111)


def test_vocab_check_and_padding(llama3):
    check_vocab_fits(llama3.vocab_size, padded_vocab_size(llama3.vocab_size))
    assert padded_vocab_size(128256) == 128256
    assert padded_vocab_size(50257) == 50304
    assert padded_vocab_size(128256, tensor_parallel_size=8) == 129024
    with pytest.raises(VocabSizeError):
        check_vocab_fits(llama3.vocab_size, 128000)
    with pytest.raises(DataError):
        padded_vocab_size(0)
