"""Fixtures for the training tests: a tiny real-text corpus and tiny-model configs (CPU, seconds per run).

The corpus is 48 CPython standard-library modules (real text, deterministic) tokenized with the
Llama-3 tokenizer into one indexed dataset under a pytest tmp dir; runs split it 90/10/0 with
megatron's document split. The model is the ``tiny`` preset narrowed to width 64 with the Llama-3
vocabulary (16.5M parameters, nearly all embeddings); a step of 4 x 32 tokens takes ~0.1 s.
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> tuple[str, Path]:
    """(indexed-dataset prefix, data cache dir) of the tiny corpus."""
    from data.preprocess import prepare_corpus
    from data.sources import FilesSource
    from data.tokenizer import TokenizerSpec

    root = tmp_path_factory.mktemp("tiny_text")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if 2_000 < p.stat().st_size < 20_000)[:48]
    for p in files:
        shutil.copy(p, root / (p.stem + ".txt"))
    out = tmp_path_factory.mktemp("tiny_prepared")
    res = prepare_corpus(
        FilesSource(root=str(root), name="tiny"),
        out / "tiny",
        tokenizer=TokenizerSpec(kind="llama3"),
        progress=False,
        log=None,
        on_invalid="skip",
    )
    return res.prefixes["all"], tmp_path_factory.mktemp("tiny_cache")


def tiny_raw(run_dir: Path, corpus: tuple[str, Path]) -> dict:
    prefix, cache = corpus
    return {
        "model": {
            "preset": "tiny",
            "vocab_size": 128256,
            "hidden_size": 64,
            "ffn_hidden_size": 128,
            "num_attention_heads": 2,
            "num_kv_heads": 1,
            "head_dim": 32,
            "max_seq_length": 64,
        },
        "attention": {"recipe": "fp8", "backend": "auto"},
        "data": {
            "corpus": [{"prefix": prefix, "weight": 1.0}],
            "split": "90,10,0",
            "seq_length": 32,
            "cache_dir": str(cache),
        },
        "training": {
            "micro_batch_size": 2,
            "global_batch_size": 4,
            "train_iters": 8,
            "lr": 3e-3,
            "min_lr": 3e-4,
            "warmup_iters": 2,
        },
        "checkpoint": {"save_interval": 4, "keep_last": 2},
        "logging": {"telemetry_interval": 4, "progress_bar": False, "tensorboard": False},
        "validation": {"interval": 4, "iters": 1},
        "runtime": {"output_dir": str(run_dir)},
    }


@pytest.fixture
def make_cfg(tiny_corpus, tmp_path):
    """make_cfg(*overrides, run="run") -> TrainConfig of a tiny run in tmp_path/run."""
    from training.config import apply_overrides, from_dict

    def _make(*overrides: str, run: str = "run"):
        return from_dict(apply_overrides(tiny_raw(tmp_path / run, tiny_corpus), list(overrides)))

    return _make


class Lines(list):
    def __call__(self, msg):
        self.append(str(msg))

    def text(self) -> str:
        return "\n".join(self)


@pytest.fixture
def train():
    """train(cfg, **trainer_kwargs) -> (exit code, log lines)."""
    from training.trainer import Trainer

    def _train(cfg, **kwargs):
        lines = Lines()
        code = Trainer(cfg, log=lines, **kwargs).run()
        return code, lines

    return _train


def metrics(run_dir: Path) -> list[dict]:
    import json

    with open(run_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def take_over(lock, record: dict, timeout: float = 10.0) -> None:
    """Another run takes ``lock`` (a held :class:`training.run_lock.RunLock`) over by writing
    ``record``, and this returns once the holder's heartbeat has seen it (``lock.lost`` set).

    A heartbeat that read its own record just before the write writes that record back over it (a
    real rival's start-up sees this at its re-read and gives up, ``RunLock._take``): the rival's
    record is written again while the holder's is found there (CI, 2026-12-06: the one-shot write was
    lost this way and the test waited out its 10 s).
    """
    deadline = time.monotonic() + timeout
    while lock.lost is None:
        if json.loads(lock.path.read_text()).get("token") != record["token"]:
            lock.path.write_text(json.dumps(record))
        assert time.monotonic() < deadline, f"the heartbeat did not see the takeover in {timeout} s"
        time.sleep(0.01)


def pytest_configure(config):
    # megatron-core warns at import about optional packages (TE, Apex, absl) and about rank discovery
    config.addinivalue_line("filterwarnings", "ignore::UserWarning:megatron")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning")
