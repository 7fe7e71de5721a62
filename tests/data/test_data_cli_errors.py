"""Bad input to ``python -m data.prepare``: exit code 2 and one line on stderr, never a traceback;
the error types behind it; DataLoader workers and Ctrl-C."""

from __future__ import annotations

import signal

import pytest

from data.errors import DataError, MissingInputError, make_dirs


def prepare(capsys, *argv) -> tuple[int, str]:
    from data.prepare import main

    code = main([*argv, "--workers", "1", "--no-progress"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


@pytest.mark.parametrize(
    "name, content, why",
    [
        ("empty.jsonl", "", "hold no data (empty or whitespace only): nothing to tokenize"),
        ("blank.jsonl", "\n  \n", "hold no data (empty or whitespace only): nothing to tokenize"),
        ("empty.txt", "", "hold no data (empty or whitespace only): nothing to tokenize"),
        ("array.jsonl", "[]\n", "hold no rows for the 'json' builder: nothing to tokenize"),
        ("header.csv", "text,id\n", "hold no rows for the 'csv' builder: nothing to tokenize"),
    ],
)
def test_input_without_documents(tmp_path, capsys, name, content, why):
    path = tmp_path / name
    path.write_text(content)
    code, err = prepare(capsys, "--input", str(path), "--output-prefix", str(tmp_path / "out" / "x"))
    assert code == 2
    assert err.startswith(f"error: [{str(path)!r}] {why}") and len(err.splitlines()) == 1
    assert not (tmp_path / "out" / "x.bin").exists()


def test_output_under_a_file(tmp_path, capsys, write_jsonl):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    code, err = prepare(
        capsys, "--input", str(write_jsonl(["one document"])), "--output-prefix", str(blocker / "sub" / "x")
    )
    assert code == 2
    assert err == (
        f"error: the output directory {blocker / 'sub'} cannot be created: {blocker} is a file, not a "
        "directory; name another directory\n"
    )
    code, err = prepare(capsys, "--default", "--cache-dir", str(blocker))
    assert code == 2
    assert (
        f"error: the data cache directory {blocker / 'default'} cannot be created: {blocker} is a file" in err
    )


def test_missing_inputs_are_data_errors_and_file_not_found(tmp_path):
    from data.indexed import verify_indexed_dataset

    with pytest.raises(MissingInputError) as err:
        verify_indexed_dataset(tmp_path / "nope")
    assert isinstance(err.value, DataError) and isinstance(err.value, FileNotFoundError)
    assert isinstance(err.value, ValueError)  # what the trainer turns into exit code 2


def test_make_dirs(tmp_path):
    assert make_dirs(tmp_path / "a" / "b", what="the x") == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "f").write_text("")
    with pytest.raises(DataError, match=r"the x .*/f/g cannot be created: .*/f is a file, not a directory"):
        make_dirs(tmp_path / "f" / "g", what="the x")


class _PidAndSigint:
    """Each sample: whether the process that reads it ignores SIGINT."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        import torch

        return {"ignores_sigint": torch.tensor(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)}


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_dataloader_workers_ignore_sigint():
    """Ctrl-C at a terminal reaches the workers too; the training process handles it (finishes the
    step, saves), so a worker must not die of it."""
    from data.sampler import build_dataloader

    # pytest started in the background of a non-interactive shell inherits SIGINT ignored: give this
    # process Python's own handler, as a training process at a terminal has it
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        loader = build_dataloader(_PidAndSigint(), consumed_samples=0, micro_batch_size=2, num_workers=1)
        assert [bool(b["ignores_sigint"].all()) for b in loader] == [True, True]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # this process is left alone
        in_process = build_dataloader(_PidAndSigint(), consumed_samples=0, micro_batch_size=2, num_workers=0)
        assert not any(bool(b["ignores_sigint"].any()) for b in in_process)
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_ctrl_c_during_prepare_is_one_line_and_130(tmp_path, capsys, monkeypatch, write_jsonl):
    import data.preprocess

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data.preprocess, "prepare_corpus", interrupted)
    code, err = prepare(
        capsys, "--input", str(write_jsonl(["one document"])), "--output-prefix", str(tmp_path / "x")
    )
    assert code == 130
    assert err == "interrupted by Ctrl-C: the outputs being written were removed\n"


def test_tokenizer_pool_workers_ignore_sigint():
    """A terminal Ctrl-C reaches the pool too: the workers leave it to the parent, which stops and
    terminates them (no traceback from every worker)."""
    import multiprocessing

    from data.preprocess import _init_worker
    from data.tokenizer import TokenizerSpec

    with multiprocessing.get_context("spawn").Pool(1, _init_worker, (TokenizerSpec(kind="llama3"),)) as pool:
        assert pool.apply(signal.getsignal, (signal.SIGINT,)) == signal.SIG_IGN


def test_hub_without_a_network_and_an_empty_hf_tokenizer_dir(tmp_path, capsys, write_jsonl):
    # conftest.py sets HF_HUB_OFFLINE / HF_DATASETS_OFFLINE: the hub cannot be reached
    code, err = prepare(capsys, "--hub", "nobody/nothing", "--output-prefix", str(tmp_path / "h"))
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: cannot reach 'nobody/nothing' on the HuggingFace hub (")
    assert err.endswith(
        "--hub needs a network; download the data elsewhere and pass its files with --input\n"
    )
    pytest.importorskip("transformers")
    (tmp_path / "hf_tok").mkdir()
    code, err = prepare(
        capsys,
        *("--input", str(write_jsonl(["one document"])), "--output-prefix", str(tmp_path / "x")),
        *("--tokenizer", "hf", "--tokenizer-path", str(tmp_path / "hf_tok")),
    )
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: cannot load a HuggingFace tokenizer from {tmp_path / 'hf_tok'}: ")
