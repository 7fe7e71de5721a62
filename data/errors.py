"""Exceptions raised by the data pipeline.

Every error names what went wrong and what to do about it; nothing in ``data`` falls back silently.
"""

from __future__ import annotations

import os
from pathlib import Path


class DataError(ValueError):
    """Base class: bad user input (configuration, files, documents) for the data pipeline."""


class DocumentError(DataError):
    """An empty or non-UTF-8 document was met while the policy for it is ``"error"``."""


class CorruptDatasetError(DataError):
    """An indexed dataset (.bin/.idx) is truncated, malformed, or its files do not match."""


class VocabSizeError(DataError):
    """A tokenizer's vocabulary (or a token id in the data) does not fit the model's embedding."""


class MissingInputError(DataError, FileNotFoundError):
    """A file or directory the user named (data file, dataset prefix, tokenizer, source directory)
    does not exist. Both a :class:`DataError` and a ``FileNotFoundError``."""


class MissingDependencyError(ImportError):
    """An optional package needed for the requested feature is not installed."""


def require(module: str, pip_name: str, feature: str):
    """Import ``module`` or raise :class:`MissingDependencyError` naming the pip package to install.

    Args:
        module: dotted module name to import.
        pip_name: the PyPI distribution that provides it (with any install flags).
        feature: what the caller needs it for, e.g. ``"HuggingFace tokenizers"``.

    Returns:
        The imported module.

    Raises:
        MissingDependencyError: the module cannot be imported.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependencyError(
            f"{feature} needs the Python package {module!r}, which is not installed: "
            f"run `pip install {pip_name}` (or `bash scripts/bootstrap.sh`)."
        ) from err


def import_megatron(module: str, feature: str):
    """Import a megatron-core module, or raise :class:`MissingDependencyError` (pin 0.19.2).

    megatron-core's package import warns about optional training-side packages (Transformer
    Engine, Apex, absl) that the data pipeline does not use; those import-time ``UserWarning`` s
    are not shown here (the training job sees them when it imports megatron-core itself).

    Args:
        module: e.g. ``"megatron.core.datasets.gpt_dataset"``.
        feature: what it is needed for (used in the error message).

    Returns:
        The imported module.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.core\..*")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"megatron\.core\..*")
        return require(module, "megatron-core==0.19.2", feature)


def make_dirs(path: str | os.PathLike, *, what: str) -> Path:
    """Create the directory ``path`` (and its parents) if needed, or say why it cannot be.

    Args:
        path: the directory.
        what: what it is, for the message, e.g. ``"the data cache directory (data.cache_dir)"``.

    Returns:
        ``Path(path)``.

    Raises:
        DataError: ``path`` or one of its parents is a file, or the directory cannot be created
            (permissions, read-only file system); the message names ``what`` and the path.
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
        raise DataError(
            f"{what} {path} cannot be created: {blocker} is a file, not a directory; name another directory"
        ) from None
    except OSError as err:
        raise DataError(
            f"{what} {path} cannot be created ({err.strerror}: {err.filename}); name a writable directory"
        ) from None
    return path
