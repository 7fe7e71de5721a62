"""Tokenizers: the real Llama-3 128K BPE (tiktoken format) and local HuggingFace tokenizer directories.

Both wrappers give the attributes megatron-core's ``GPTDatasetConfig(tokenizer=...)`` reads
(``vocab_size``, ``eod``, ``eos``, ``pad``, ``unique_identifiers``) plus ``encode`` /
``encode_document`` / ``decode``.  Documents are framed as in Llama-3 pretraining:
``<|begin_of_text|> text <|end_of_text|>``.

Nothing is loaded from a model hub: the Llama-3 file ships inside the PyPI package ``llama-models``
(install it with ``pip install --no-deps llama-models``), and an HF tokenizer must be a local directory.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data.errors import DataError, MissingDependencyError, MissingInputError, VocabSizeError, require

LLAMA3_NUM_BASE_TOKENS = 128000
LLAMA3_NUM_SPECIAL_TOKENS = 256
LLAMA3_VOCAB_SIZE = LLAMA3_NUM_BASE_TOKENS + LLAMA3_NUM_SPECIAL_TOKENS  # 128256
# The Llama-3 pre-tokenizer split pattern (identical to llama_models/llama3/tokenizer.py).
LLAMA3_PAT_STR = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_NAMED_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
]
# Meta's reference encoder cuts text into 400k-character pieces and cuts runs of more than 25k
# whitespace / non-whitespace characters (tiktoken issue 195); we do the same so ids match it.
_MAX_ENCODE_CHARS = 400_000
_MAX_RUN_CHARS = 25_000
_UNICODE_SPACES = np.array([c for c in range(0x110000) if chr(c).isspace()], dtype=np.uint32)

TOKENIZER_KINDS = ("llama3", "hf")


def llama3_special_tokens() -> list[str]:
    """The 256 Llama-3 special token strings in id order (id = 128000 + position).

    Returns:
        list of 256 str: ``<|begin_of_text|>`` (128000), ``<|end_of_text|>`` (128001), ...
    """
    reserved = [
        f"<|reserved_special_token_{2 + i}|>"
        for i in range(LLAMA3_NUM_SPECIAL_TOKENS - len(_LLAMA3_NAMED_SPECIALS))
    ]
    return _LLAMA3_NAMED_SPECIALS + reserved


def default_llama3_model_path() -> Path:
    """Path of ``llama_models/llama3/tokenizer.model`` shipped in the PyPI package ``llama-models``.

    The package is located without importing it (its ``__init__`` is not run).

    Returns:
        Path to the tiktoken BPE file (about 2.2 MB, 128000 lines ``<base64 token> <rank>``).

    Raises:
        MissingDependencyError: ``llama-models`` is not installed.
        MissingInputError: the package is installed but has no ``llama3/tokenizer.model``.
    """
    spec = importlib.util.find_spec("llama_models")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            "The Llama-3 tokenizer file ships in the PyPI package 'llama-models', which is not "
            "installed: run `pip install --no-deps llama-models==0.3.0` (its other dependencies are "
            "not needed), or pass the path of a Llama-3 tiktoken tokenizer.model explicitly."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "llama3" / "tokenizer.model"
    if not path.is_file():
        raise MissingInputError(
            f"llama-models is installed but {path} is missing; reinstall it with "
            "`pip install --force-reinstall --no-deps llama-models==0.3.0`."
        )
    return path


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _load_tiktoken_bpe(path: Path) -> dict[bytes, int]:
    """Parse a tiktoken BPE file strictly (a malformed line is an error, not skipped)."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise DataError(f"{path}:{lineno}: expected '<base64 token> <rank>', got {line[:80]!r}")
            try:
                ranks[base64.b64decode(parts[0], validate=True)] = int(parts[1])
            except ValueError as err:
                raise DataError(f"{path}:{lineno}: bad tiktoken BPE line {line[:80]!r}: {err}") from err
    return ranks


def _runs_exceed(text: str, limit: int) -> bool:
    """True if ``text`` has more than ``limit`` consecutive whitespace or non-whitespace chars."""
    if len(text) <= limit:
        return False
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    is_space = np.isin(cps, _UNICODE_SPACES)
    change = np.flatnonzero(is_space[1:] != is_space[:-1]) + 1
    bounds = np.concatenate(([0], change, [cps.size]))
    return int(np.max(np.diff(bounds))) > limit


def _split_runs(text: str, limit: int) -> Iterator[str]:
    """Meta's ``_split_whitespaces_or_nonwhitespaces``: cut runs longer than ``limit`` chars."""
    if not _runs_exceed(text, limit):
        yield text
        return
    run_len = 0
    run_is_space = text[0].isspace() if text else False
    start = 0
    for i, ch in enumerate(text):
        now_space = ch.isspace()
        if run_is_space ^ now_space:
            run_len = 1
            run_is_space = now_space
        else:
            run_len += 1
            if run_len > limit:
                yield text[start:i]
                start = i
                run_len = 1
    yield text[start:]


@dataclass(frozen=True)
class TokenizerSpec:
    """A picklable description of a tokenizer, used to rebuild it in worker processes.

    Attributes:
        kind: ``"llama3"`` (tiktoken BPE file) or ``"hf"`` (local HuggingFace tokenizer directory).
        path: the file (llama3) or directory (hf); ``None`` for llama3 means the file shipped in
            ``llama-models``.
        add_bos: prepend the BOS token to every document.
        add_eos: append the EOS token to every document (Megatron's EOD).
    """

    kind: str = "llama3"
    path: str | None = None
    add_bos: bool = True
    add_eos: bool = True

    def build(self) -> Tokenizer:
        """Load the tokenizer this spec names (see :func:`build_tokenizer` for errors raised)."""
        return build_tokenizer(kind=self.kind, path=self.path, add_bos=self.add_bos, add_eos=self.add_eos)


class Tokenizer(ABC):
    """Common interface of the wrappers (also what megatron-core's GPTDatasetConfig reads).

    Attributes:
        spec: the :class:`TokenizerSpec` that rebuilds this tokenizer.
        vocab_size: int, number of ids (max id + 1); the model's embedding must have at least this.
        bos: int or None, id prepended to documents when ``spec.add_bos``.
        eos / eod: int, id appended to documents when ``spec.add_eos`` (Megatron's end of document).
        pad: int, a pad id that never occurs in data, or -1 (Megatron's sentinel) if there is none.
        unique_identifiers: OrderedDict, part of megatron-core's dataset index-cache key.
    """

    spec: TokenizerSpec
    vocab_size: int
    bos: int | None
    eos: int
    pad: int
    file_sha256: str  # of the tokenizer file(s)

    @property
    def unique_identifiers(self) -> OrderedDict[str, object]:
        """What identifies this tokenizer in megatron-core's dataset index-cache key."""
        return OrderedDict(
            [
                ("class", type(self).__name__),
                ("file_sha256", self.file_sha256),
                ("vocab_size", self.vocab_size),
                ("bos", self.bos if self.spec.add_bos else None),
                ("eos", self.eos if self.spec.add_eos else None),
                ("pad", self.pad),
            ]
        )

    @property
    def eod(self) -> int:
        """End-of-document id used by megatron-core (= ``eos``)."""
        return self.eos

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Tokenize ``text`` without adding special tokens; special-token text stays plain text.

        Args:
            text: str.

        Returns:
            list of int token ids in ``[0, vocab_size)``.
        """

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Detokenize ids (special tokens are rendered as their text, e.g. ``<|begin_of_text|>``).

        Args:
            ids: sequence of int (list, numpy array or 1-D tensor).

        Returns:
            str; bytes that are not valid UTF-8 (a cut multi-byte char) become U+FFFD.
        """

    def encode_document(self, text: str) -> list[int]:
        """Tokenize one document framed as in Llama-3 pretraining: ``[bos] + encode(text) + [eos]``.

        Args:
            text: the document, str.

        Returns:
            list of int ids; BOS/EOS included according to ``spec.add_bos`` / ``spec.add_eos``.
        """
        ids = self.encode(text)
        if self.spec.add_bos:
            ids.insert(0, self.bos)
        if self.spec.add_eos:
            ids.append(self.eos)
        return ids


class Llama3Tokenizer(Tokenizer):
    """The Llama-3 / 3.1 128K tiktoken BPE with its 256 special tokens (vocab 128256).

    ``encode("Hello, world!") == [9906, 11, 1917, 0]``; BOS ``<|begin_of_text|>`` = 128000,
    EOS ``<|end_of_text|>`` = 128001, pad ``<|finetune_right_pad_id|>`` = 128004.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, add_bos: bool = True, add_eos: bool = True):
        """Load the BPE file.

        Args:
            path: tiktoken BPE file; ``None`` = the one shipped in ``llama-models``.
            add_bos / add_eos: document framing used by :meth:`encode_document`.

        Raises:
            MissingDependencyError: ``tiktoken`` or (path None) ``llama-models`` missing.
            MissingInputError: ``path`` does not exist.
            DataError: the file is malformed or is not a 128000-token Llama-3 BPE.
        """
        tiktoken = require("tiktoken", "tiktoken", "The Llama-3 tokenizer")
        model_path = Path(path) if path is not None else default_llama3_model_path()
        if not model_path.is_file():
            raise MissingInputError(f"Llama-3 tokenizer file not found: {model_path}")
        ranks = _load_tiktoken_bpe(model_path)
        if len(ranks) != LLAMA3_NUM_BASE_TOKENS or sorted(ranks.values()) != list(range(len(ranks))):
            raise DataError(
                f"{model_path} has {len(ranks)} BPE ranks; a Llama-3 tokenizer.model has exactly "
                f"{LLAMA3_NUM_BASE_TOKENS} with ranks 0..{LLAMA3_NUM_BASE_TOKENS - 1}. Use kind='hf' "
                "for other tokenizers."
            )
        specials = {tok: LLAMA3_NUM_BASE_TOKENS + i for i, tok in enumerate(llama3_special_tokens())}
        self._enc = tiktoken.Encoding(
            name=model_path.name, pat_str=LLAMA3_PAT_STR, mergeable_ranks=ranks, special_tokens=specials
        )
        self.special_tokens = specials
        self.spec = TokenizerSpec(
            kind="llama3", path=None if path is None else str(path), add_bos=add_bos, add_eos=add_eos
        )
        self.vocab_size = LLAMA3_VOCAB_SIZE
        self.bos = specials["<|begin_of_text|>"]
        self.eos = specials["<|end_of_text|>"]
        self.pad = specials["<|finetune_right_pad_id|>"]
        self.file_sha256 = _sha256_file(model_path)

    def encode(self, text: str) -> list[int]:
        """See :meth:`Tokenizer.encode`; matches Meta's ``Tokenizer.encode(s, bos=False, eos=False)``."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids: list[int] = []
        for i in range(0, len(text), _MAX_ENCODE_CHARS):
            for piece in _split_runs(text[i : i + _MAX_ENCODE_CHARS], _MAX_RUN_CHARS):
                ids.extend(self._enc.encode_ordinary(piece))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """See :meth:`Tokenizer.decode`."""
        return self._enc.decode([int(i) for i in ids])


class HFTokenizer(Tokenizer):
    """A HuggingFace tokenizer loaded from a local directory (``transformers.AutoTokenizer``)."""

    def __init__(self, path: str | os.PathLike, *, add_bos: bool = True, add_eos: bool = True):
        """Load ``path`` with ``local_files_only=True`` (never from the hub).

        Args:
            path: a directory holding tokenizer.json / tokenizer_config.json (or equivalent).
            add_bos / add_eos: document framing used by :meth:`encode_document`.

        Raises:
            MissingDependencyError: ``transformers`` is not installed.
            MissingInputError: ``path`` is not an existing directory.
            DataError: the tokenizer cannot be loaded, or lacks a BOS (with add_bos) or EOS token.
        """
        if path is None or not Path(path).is_dir():
            raise MissingInputError(
                f"HF tokenizer directory not found: {path!r} (kind='hf' needs a local directory; "
                "hub names are not loaded at run time)"
            )
        transformers = require("transformers", "transformers", "HuggingFace tokenizers (kind='hf')")
        try:
            tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as err:
            why = " ".join(str(err).split())  # transformers' message spans several lines
            raise DataError(f"cannot load a HuggingFace tokenizer from {path}: {why}") from err
        if add_eos and tok.eos_token_id is None:
            raise DataError(
                f"HF tokenizer at {path} has no eos_token; set one in its "
                "tokenizer_config.json (it is Megatron's end-of-document token)"
            )
        if add_bos and tok.bos_token_id is None:
            raise DataError(
                f"HF tokenizer at {path} has no bos_token; set one in its "
                "tokenizer_config.json or pass add_bos=False (--no-bos)"
            )
        if tok.eos_token_id is None:
            raise DataError(f"HF tokenizer at {path} has no eos_token (needed as Megatron's EOD id)")
        self._tok = tok
        self.spec = TokenizerSpec(kind="hf", path=str(path), add_bos=add_bos, add_eos=add_eos)
        self.vocab_size = max(max(tok.get_vocab().values()) + 1, len(tok))
        self.bos = tok.bos_token_id
        self.eos = tok.eos_token_id
        specials = {self.bos, self.eos}
        self.pad = (
            tok.pad_token_id if tok.pad_token_id is not None and tok.pad_token_id not in specials else -1
        )
        h = hashlib.sha256()
        for f in sorted(Path(path).iterdir()):
            if f.is_file() and ("token" in f.name or f.name in ("vocab.json", "merges.txt", "vocab.txt")):
                h.update(f.name.encode() + b"\0" + f.read_bytes())
        self.file_sha256 = h.hexdigest()

    def encode(self, text: str) -> list[int]:
        """See :meth:`Tokenizer.encode` (``add_special_tokens=False, split_special_tokens=True``)."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        return list(self._tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """See :meth:`Tokenizer.decode`."""
        return self._tok.decode(
            [int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )


def build_tokenizer(
    kind: str = "llama3", path: str | os.PathLike | None = None, *, add_bos: bool = True, add_eos: bool = True
) -> Tokenizer:
    """Build a tokenizer.

    Args:
        kind: ``"llama3"`` (the Llama-3 128K tiktoken BPE; ``path`` optional) or ``"hf"`` (a local
            HuggingFace tokenizer directory; ``path`` required).
        path: file (llama3) or directory (hf).
        add_bos / add_eos: document framing; Llama-3 pretraining uses both.

    Returns:
        :class:`Llama3Tokenizer` or :class:`HFTokenizer`.

    Raises:
        DataError: unknown ``kind``, or a malformed tokenizer.
        MissingInputError / MissingDependencyError: see the wrapper classes.
    """
    if kind == "llama3":
        return Llama3Tokenizer(path, add_bos=add_bos, add_eos=add_eos)
    if kind == "hf":
        return HFTokenizer(path, add_bos=add_bos, add_eos=add_eos)
    raise DataError(f"unknown tokenizer kind {kind!r}; choose one of {TOKENIZER_KINDS}")


def padded_vocab_size(vocab_size: int, *, divisible_by: int = 128, tensor_parallel_size: int = 1) -> int:
    """Megatron's embedding size: ``vocab_size`` rounded up to a multiple of ``divisible_by * TP``.

    Args:
        vocab_size: tokenizer vocabulary size (128256 for Llama-3.1, already a multiple of 128).
        divisible_by: Megatron's ``--make-vocab-size-divisible-by`` (default 128).
        tensor_parallel_size: TP degree.

    Returns:
        int >= vocab_size.

    Raises:
        DataError: a non-positive argument.
    """
    if vocab_size <= 0 or divisible_by <= 0 or tensor_parallel_size <= 0:
        raise DataError(
            f"padded_vocab_size needs positive ints, got {vocab_size}, {divisible_by}, {tensor_parallel_size}"
        )
    multiple = divisible_by * tensor_parallel_size
    return -(-vocab_size // multiple) * multiple


def check_vocab_fits(tokenizer_vocab_size: int, model_vocab_size: int) -> None:
    """Raise unless every token id of the tokenizer has a row in the model's embedding.

    Args:
        tokenizer_vocab_size: ``tokenizer.vocab_size`` (max id + 1).
        model_vocab_size: the model's (padded) embedding rows, e.g. 128256 for Llama-3.1.

    Raises:
        VocabSizeError: ``tokenizer_vocab_size > model_vocab_size``.
    """
    if tokenizer_vocab_size > model_vocab_size:
        raise VocabSizeError(
            f"tokenizer vocabulary ({tokenizer_vocab_size} ids) exceeds the model's embedding "
            f"({model_vocab_size} rows): token ids >= {model_vocab_size} would index out of range. "
            "Use the model's tokenizer or raise the model's vocab_size (padded_vocab_size())."
        )
