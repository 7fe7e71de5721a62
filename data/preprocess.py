"""Preprocessing: a document source -> validated, tokenized documents -> megatron-core indexed
datasets (one ``.bin/.idx`` pair per split), with worker processes and a progress bar.

Each document becomes one sequence ``[BOS] tokens [EOS]`` (Llama-3 pretraining framing).  Empty
(whitespace-only) and invalid (not UTF-8, lone surrogates, not a string) documents are skipped and
counted, or raise :class:`~data.errors.DocumentError`, according to ``on_empty`` / ``on_invalid``.

Outputs are all-or-nothing: every split is written under a temporary name and verified, the old
manifest is removed, the pairs are renamed into place, and ``<prefix>.manifest.json`` is written
last.  An output is *complete* only if its manifest exists and matches the files.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np

from data.errors import DataError, DocumentError, make_dirs
from data.indexed import IndexedDatasetWriter, bin_path, idx_path
from data.manifest import (
    MANIFEST_FORMAT,
    atomic_write_json,
    describe_files,
    file_lock,
    read_manifest,
    verify_manifest_outputs,
)
from data.sources import DocumentSource
from data.tokenizer import Tokenizer, TokenizerSpec, check_vocab_fits

POLICIES = ("skip", "error")
SPLIT_NAMES = ("train", "valid", "test")
PREPROCESS_VERSION = 1  # bump when the document framing / file layout changes


def parse_split(split: str) -> list[float]:
    """Parse a Megatron split string such as ``"98,1,1"`` into normalized train/valid/test weights.

    Args:
        split: 1 to 3 comma-separated non-negative numbers (missing ones are 0).

    Returns:
        list of 3 floats summing to 1.

    Raises:
        DataError: malformed string, negative or all-zero weights, or more than 3 entries.
    """
    parts = [p.strip() for p in str(split).split(",")]
    try:
        weights = [float(p) for p in parts]
    except ValueError as err:
        raise DataError(f"split {split!r} must be comma-separated numbers like '98,1,1'") from err
    if not 1 <= len(weights) <= 3 or any(w < 0 or w != w for w in weights) or sum(weights) <= 0:
        raise DataError(f"split {split!r} needs 1-3 non-negative weights with a positive sum")
    weights += [0.0] * (3 - len(weights))
    total = sum(weights)
    return [w / total for w in weights]


def assign_splits(num_documents: int, split: str, seed: int) -> np.ndarray:
    """Assign each document index to train (0), valid (1) or test (2).

    A seeded permutation is cut with Megatron's rule (``round(begin * n) .. round(end * n)``), so
    the counts are exact and the assignment depends only on ``(num_documents, split, seed)``.

    Args:
        num_documents: n.
        split: split string (see :func:`parse_split`).
        seed: permutation seed.

    Returns:
        int8 array of shape (n,).

    Raises:
        DataError: a split with positive weight would receive no document.
    """
    weights = parse_split(split)
    perm = np.random.default_rng(seed).permutation(num_documents)
    out = np.full(num_documents, -1, dtype=np.int8)
    bounds = np.concatenate(([0.0], np.cumsum(weights)))
    for i in range(3):
        beg, end = int(round(bounds[i] * num_documents)), int(round(bounds[i + 1] * num_documents))
        if weights[i] > 0 and end <= beg:
            raise DataError(
                f"split {split!r} gives the {SPLIT_NAMES[i]} split no document out of "
                f"{num_documents}; use a larger corpus or set that weight to 0"
            )
        out[perm[beg:end]] = i
    return out


def validate_document(payload: object) -> tuple[str, str | None]:
    """Classify a raw document.

    Args:
        payload: ``str``, ``bytes`` (must be UTF-8), or anything else.

    Returns:
        ``("ok", text)``, ``("empty", None)`` for whitespace-only text, or ``("invalid", reason)``.
    """
    if isinstance(payload, bytes):
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError as err:
            return "invalid", f"not UTF-8 ({err.reason} at byte {err.start})"
    elif isinstance(payload, str):
        text = payload
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            return "invalid", f"not UTF-8 (lone surrogate at char {err.start})"
    else:
        return "invalid", f"not text ({type(payload).__name__})"
    if not text.strip():
        return "empty", None
    return "ok", text


_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(spec: TokenizerSpec) -> None:
    global _WORKER_TOKENIZER
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops and terminates the pool
    _WORKER_TOKENIZER = spec.build()


def _encode_job(job: tuple[int, str, object]) -> tuple[int, str, str, np.ndarray | None, str | None]:
    index, name, payload = job
    status, text = validate_document(payload)
    if status != "ok":
        return index, name, status, None, text
    ids = np.asarray(_WORKER_TOKENIZER.encode_document(text), dtype=np.int32)
    return index, name, status, ids, None


@dataclass
class PrepareResult:
    """Outcome of :func:`prepare_corpus` (also stored in the manifest).

    Attributes:
        name: corpus label.
        prefixes: ``{"train"|"valid"|"test"|"all": output prefix}`` that were written.
        documents / tokens: totals written (tokens include BOS/EOS).
        documents_per_split / tokens_per_split: the same per split key.
        skipped_empty / skipped_invalid: documents skipped under the ``"skip"`` policies.
        skipped_examples: up to 10 ``"name: reason"`` strings.
        seconds: wall time of the preparation (0 when reused).
        reused: True when a complete, matching output already existed and nothing was done.
        manifest: path of the manifest JSON.
    """

    name: str
    prefixes: dict[str, str]
    documents: int
    tokens: int
    documents_per_split: dict[str, int]
    tokens_per_split: dict[str, int]
    skipped_empty: int
    skipped_invalid: int
    skipped_examples: list[str] = field(default_factory=list)
    seconds: float = 0.0
    reused: bool = False
    manifest: str = ""

    def summary(self) -> str:
        """One line: documents, tokens, skipped counts and elapsed time."""
        how = "reused (complete and verified)" if self.reused else f"in {self.seconds:.1f} s"
        return (
            f"{self.name}: {self.documents} documents, {self.tokens} tokens "
            f"(skipped {self.skipped_empty} empty, {self.skipped_invalid} invalid) {how}"
        )


def _settings(
    source: DocumentSource, tok: Tokenizer, split: str | None, split_seed: int, on_empty: str, on_invalid: str
) -> dict:
    return {
        "preprocess_version": PREPROCESS_VERSION,
        "source": source.describe(),
        "source_fingerprint": source.fingerprint(),
        "tokenizer": dict(tok.unique_identifiers),
        "split": split,
        "split_seed": split_seed,
        "on_empty": on_empty,
        "on_invalid": on_invalid,
    }


def manifest_path(output_prefix: str | os.PathLike) -> str:
    """``<output_prefix>.manifest.json``."""
    return f"{os.fspath(output_prefix)}.manifest.json"


def load_complete(
    output_prefix: str | os.PathLike, settings: dict | None = None, *, hashes: bool = True
) -> PrepareResult | None:
    """Return the recorded result if ``output_prefix`` holds a complete, verified preparation.

    Args:
        output_prefix: as given to :func:`prepare_corpus`.
        settings: if given, the manifest's recorded settings must equal these.
        hashes: verify file sha256 (else sizes only).

    Returns:
        :class:`PrepareResult` with ``reused=True``, or None if absent, stale or not matching.
    """
    man = read_manifest(manifest_path(output_prefix))
    if man is None or (settings is not None and man.get("settings") != settings):
        return None
    try:
        verify_manifest_outputs(man, os.path.dirname(os.path.abspath(output_prefix)), hashes=hashes)
    except (OSError, DataError):
        return None
    res = dict(man["result"])
    res.update(reused=True, seconds=0.0, manifest=manifest_path(output_prefix))
    base = os.path.dirname(os.path.abspath(output_prefix))
    res["prefixes"] = {k: os.path.join(base, v) for k, v in res["prefixes"].items()}
    return PrepareResult(**res)


def prepare_corpus(
    source: DocumentSource,
    output_prefix: str | os.PathLike,
    *,
    tokenizer: Tokenizer | TokenizerSpec,
    split: str | None = None,
    split_seed: int = 1234,
    workers: int = 1,
    on_empty: str = "skip",
    on_invalid: str = "error",
    model_vocab_size: int | None = None,
    progress: bool = True,
    reuse: bool = True,
    log: Callable[[str], None] | None = print,
) -> PrepareResult:
    """Tokenize ``source`` into megatron-core indexed datasets.

    Output files: with ``split=None`` one pair ``<output_prefix>.bin/.idx`` (key ``"all"``);
    with a split string, ``<output_prefix>_train``, ``_valid``, ``_test`` pairs for each split of
    positive weight; plus ``<output_prefix>.manifest.json`` (written last).  Tokens are int32.

    Args:
        source: a :class:`~data.sources.DocumentSource`.
        output_prefix: path prefix of the outputs (directories are created).
        tokenizer: a tokenizer or its spec (workers rebuild it from the spec).
        split: e.g. ``"98,1,1"``; documents are assigned by :func:`assign_splits`.
        split_seed: seed of that assignment.
        workers: tokenizer processes (1 = in this process).
        on_empty / on_invalid: ``"skip"`` (skip and count) or ``"error"`` (raise DocumentError).
        model_vocab_size: if given, the tokenizer's vocabulary must fit it (checked first).
        progress: show a tqdm progress bar on stderr.
        reuse: return the recorded result if a complete output with identical settings exists.
        log: callable for the summary line (None = silent).

    Returns:
        :class:`PrepareResult`.

    Raises:
        DataError: bad split/policy/workers, or a split that ends up with no document.
        DocumentError: an empty/invalid document under the ``"error"`` policy.
        VocabSizeError: the tokenizer does not fit ``model_vocab_size``.
        MissingInputError / MissingDependencyError: from the source or tokenizer.
        On any error no new output (and no manifest) is left behind.
    """
    if on_empty not in POLICIES or on_invalid not in POLICIES:
        raise DataError(f"on_empty/on_invalid must be one of {POLICIES}, got {on_empty!r}/{on_invalid!r}")
    if not isinstance(workers, int) or workers < 1:
        raise DataError(f"workers must be an int >= 1, got {workers!r}")
    tok = tokenizer.build() if isinstance(tokenizer, TokenizerSpec) else tokenizer
    if model_vocab_size is not None:
        check_vocab_fits(tok.vocab_size, model_vocab_size)
    output_prefix = os.path.abspath(os.fspath(output_prefix))
    base = os.path.dirname(output_prefix)
    make_dirs(base, what="the output directory")
    settings = _settings(source, tok, split, split_seed, on_empty, on_invalid)

    with file_lock(output_prefix + ".lock"):
        if reuse:
            done = load_complete(output_prefix, settings)
            if done is not None:
                if log:
                    log(done.summary())
                return done
        esc = glob.escape(output_prefix)
        for pattern in (".tmp-*", "_train.tmp-*", "_valid.tmp-*", "_test.tmp-*", ".manifest.json.tmp-*"):
            for stale in glob.glob(esc + pattern):
                os.remove(stale)  # left by a killed run; we hold the lock
        return _prepare_locked(
            source,
            output_prefix,
            tok,
            settings,
            split,
            split_seed,
            workers,
            on_empty,
            on_invalid,
            progress,
            log,
        )


def _jobs(source: DocumentSource) -> Iterator[tuple[int, str, object]]:
    for i, (name, payload) in enumerate(source):
        yield i, name, payload


def _prepare_locked(
    source, output_prefix, tok, settings, split, split_seed, workers, on_empty, on_invalid, progress, log
) -> PrepareResult:
    global _WORKER_TOKENIZER
    t0 = time.perf_counter()
    n = len(source)
    if n == 0:
        raise DataError(f"source {source.name!r} has no documents")
    if split is None:
        keys, assignment = ["all"], None
        prefixes = {"all": output_prefix}
    else:
        assignment = assign_splits(n, split, split_seed)
        weights = parse_split(split)
        keys = [SPLIT_NAMES[i] for i in range(3) if weights[i] > 0]
        prefixes = {k: f"{output_prefix}_{k}" for k in keys}
    writers = {k: IndexedDatasetWriter(prefixes[k], vocab_size=tok.vocab_size) for k in keys}
    skipped = {"empty": 0, "invalid": 0}
    examples: list[str] = []
    pool = None
    try:
        if workers > 1:
            pool = multiprocessing.get_context("spawn").Pool(
                workers, initializer=_init_worker, initargs=(tok.spec,)
            )
            results: Iterable = pool.imap(_encode_job, _jobs(source), chunksize=8)
        else:
            _WORKER_TOKENIZER = tok
            results = map(_encode_job, _jobs(source))
        bar = _progress(n, source.name, progress)
        for index, name, status, ids, reason in results:
            bar.update(1)
            if status != "ok":
                policy = on_empty if status == "empty" else on_invalid
                why = reason or "empty or whitespace-only"
                if policy == "error":
                    raise DocumentError(
                        f"document {name!r} of {source.name!r} is {status}: {why} "
                        f"(to skip and count such documents use on_{status}='skip' / "
                        f"--on-{status} skip)"
                    )
                skipped[status] += 1
                if len(examples) < 10:
                    examples.append(f"{name}: {why}")
                continue
            key = "all" if assignment is None else SPLIT_NAMES[assignment[index]]
            writers[key].add_document(ids)
        bar.close()
        summaries = {k: w.finalize() for k, w in writers.items()}
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        if workers == 1:
            _WORKER_TOKENIZER = None

    # all splits verified under temporary names: invalidate the old manifest, publish, record.
    man_path = manifest_path(output_prefix)
    if os.path.exists(man_path):
        os.remove(man_path)
    for w in writers.values():
        w.publish()
    result = PrepareResult(
        name=source.name,
        prefixes=dict(prefixes),
        documents=sum(s.num_documents for s in summaries.values()),
        tokens=sum(s.num_tokens for s in summaries.values()),
        documents_per_split={k: s.num_documents for k, s in summaries.items()},
        tokens_per_split={k: s.num_tokens for k, s in summaries.items()},
        skipped_empty=skipped["empty"],
        skipped_invalid=skipped["invalid"],
        skipped_examples=examples,
        seconds=time.perf_counter() - t0,
        manifest=man_path,
    )
    files = [p for pre in prefixes.values() for p in (bin_path(pre), idx_path(pre))]
    rec = asdict(result)
    rec["prefixes"] = {k: os.path.basename(v) for k, v in prefixes.items()}
    rec.pop("manifest")
    atomic_write_json(
        man_path,
        {
            "manifest_format": MANIFEST_FORMAT,
            "settings": settings,
            "result": rec,
            "files": describe_files(files, os.path.dirname(output_prefix)),
        },
    )
    result.seconds = time.perf_counter() - t0
    if log:
        log(result.summary())
    return result


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from data.errors import require

    tqdm = require("tqdm", "tqdm", "The preprocessing progress bar (or pass progress=False)")
    return tqdm.tqdm(total=total, desc=f"tokenizing {desc}", unit="doc", file=sys.stderr, mininterval=0.5)
