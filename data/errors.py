"""Exceptions raised by the data pipeline.

Every error names what went wrong and what to do about it; nothing in ``data`` falls back silently.
"""

from __future__ import annotations


class DataError(ValueError):
    """Base class: bad user input (configuration, files, documents) for the data pipeline."""


class DocumentError(DataError):
    """An empty or non-UTF-8 document was met while the policy for it is ``"error"``."""


class CorruptDatasetError(DataError):
    """An indexed dataset (.bin/.idx) is truncated, malformed, or its files do not match."""


class VocabSizeError(DataError):
    """A tokenizer's vocabulary (or a token id in the data) does not fit the model's embedding."""


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
