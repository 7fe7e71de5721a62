"""A corpus prepared again at the same prefix between two launches (CPU, in-process): megatron-core's
dataset identity names the prefix, not the files, so the resume compares the files' digest too
(``data.content``) and stops with exit code 2 naming it, unless it is allowed."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

from training import checkpoint as ckpt
from training.config import apply_overrides, from_dict
from training.signals import EXIT_CONFIG, EXIT_DONE

from .conftest import metrics, tiny_raw


def _prepare(files: list[Path], src: Path, out: Path) -> str:
    from data.preprocess import prepare_corpus
    from data.sources import FilesSource
    from data.tokenizer import TokenizerSpec

    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for p in files:
        shutil.copy(p, src / (p.stem + ".txt"))
    res = prepare_corpus(
        FilesSource(root=str(src), name="c"),
        out,
        tokenizer=TokenizerSpec(kind="llama3"),
        progress=False,
        log=None,
    )
    return res.prefixes["all"]


def test_a_corpus_prepared_again_stops_the_resume_unless_allowed(train, tmp_path):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if 2_000 < p.stat().st_size < 20_000)
    prefix = _prepare(files[:40], tmp_path / "src", tmp_path / "prep" / "c")

    def cfg(*overrides):
        raw = tiny_raw(tmp_path / "run", (prefix, tmp_path / "cache"))
        return from_dict(apply_overrides(raw, list(overrides)))

    code, log = train(cfg())
    assert code == EXIT_DONE, log.text()
    root = tmp_path / "run" / "checkpoints"
    shutil.rmtree(ckpt.iter_dir(root, 8))  # as if stopped after the save of step 4
    (root / ckpt.MARKER).write_text("4\n")

    assert _prepare(files[40:80], tmp_path / "src", tmp_path / "prep" / "c") == prefix  # other text
    code, log = train(cfg())
    assert code == EXIT_CONFIG, log.text()
    text = log.text()
    assert f"cannot resume from {ckpt.iter_dir(root, 4)}: the config differs in\n  data.content: '" in text
    assert "data.identity" not in text  # megatron-core's identity names the prefix: unchanged
    assert "they were prepared again or replaced since the checkpoint" in text
    assert "checkpoint.allow_config_change=[data.content]" in text

    code, log = train(cfg("checkpoint.allow_config_change=[data.content]"))
    assert code == EXIT_DONE, log.text()
    assert "resume: allowed config change data.content: '" in log.text()
    events = [(r["event"], r["step"]) for r in metrics(tmp_path / "run") if r["kind"] == "event"]
    assert ("resume", 4) in events
