"""Compiled CuTe kernels reused across processes (opt-in): a 64-GPU job need not compile the same
kernel on every rank at every restart.

With ``FP4_ATTENTION_CUTE_CACHE_DIR`` set, the cute backend's compiled kernels are exported with
the CUTLASS DSL's ahead-of-time export (``export_to_c``: an object file per kernel) into
``$FP4_ATTENTION_CUTE_CACHE_DIR/<fingerprint>/``, and loaded from there by later processes
instead of compiled. flash-attn-4's persistent JIT cache (``flash_attn.cute.cache_utils``) does the
export, the load and the file locking. It writes to a temporary name and renames it into place; a
damaged entry counts as a miss and is replaced.

The fingerprint changes with any of these, so a changed kernel is never loaded stale:
- the source of this package;
- the V key order the kernels are built for (``backends/pv_layout.py``);
- flash-attn-4's own source fingerprint (its CuTe sources, the CUTLASS DSL and TVM-FFI versions, Python);
- the version of quack-kernels, whose layout and sm90 helpers the kernels trace (flash-attn-4 does not
  pin it, and its fingerprint leaves it out);
- the target architecture (``CUTE_DSL_ARCH``, or the GPU's compute capability as the DSL names it);
- the CUTLASS DSL's compiler library that compiles them, by name and SHA-256 (the DSL ships the
  hash, ``_cutlass_ir_version_cu1X.py``): version 4.8.1 comes with a CUDA 12 and a CUDA 13 build,
  which give different SASS for the same kernel (:func:`compiler_dso`); the DSL's version alone
  does not tell them apart.

A machine without a GPU can fill the cache for a GPU one: ``prebuild.py``
(``tools/prebuild_cute_kernels.py``).

The cache stays off unless the variable is set. Export and load passed on the H200
(``results/cute_prep_h200``: 24 cute tests took 102 s compiling, 14 s in a second process loading).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from pathlib import Path

__all__ = ["ENV", "compiler_dso", "make_cache", "source_fingerprint"]

ENV = "FP4_ATTENTION_CUTE_CACHE_DIR"
_PACKAGE = Path(__file__).resolve().parent
_SOURCES = (*sorted(_PACKAGE.glob("*.py")), _PACKAGE.parent / "pv_layout.py")


def _target() -> str:
    """The architecture the CUTLASS DSL compiles for: ``CUTE_DSL_ARCH``, else the GPU's, named as
    the DSL names it when it detects one (``sm_90a`` on an H100/H200: the arch-specific target from
    sm_90 on), so a cache filled on a CPU with ``CUTE_DSL_ARCH=sm_90a`` (``prebuild.py``) has the
    fingerprint a GPU process computes without the variable."""
    arch = os.environ.get("CUTE_DSL_ARCH")
    if arch:
        return arch
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}{'a' if major >= 9 else ''}"
    return "no-gpu"


def compiler_dso() -> tuple[str, str]:
    """``(flavour, "<file name>:<sha256>")`` of the CUTLASS DSL compiler library this process loaded:
    flavour ``cu12`` or ``cu13`` (the CUDA build of nvidia-cutlass-dsl's libraries; ``unknown``
    where the module's file name does not say), the name and the DSL's own SHA-256 of it (empty
    where the DSL ships none)."""
    import importlib
    import sys

    import cutlass  # noqa: F401  (loads the compiler library)

    mod = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    name = os.path.basename(getattr(mod, "__file__", None) or "unknown")
    parts = name.split(".")
    flavour = parts[1] if len(parts) > 2 and parts[1].startswith("cu") else "unknown"
    try:
        stamps = importlib.import_module(f"cutlass._mlir._mlir_libs._cutlass_ir_version_{flavour}")
        sha = stamps.DSO_SHA256.get(name, "")
    except ImportError:
        sha = ""
    return flavour, f"{name}:{sha}"


def source_fingerprint() -> str:
    """SHA-256 (hex, 16 characters) of the kernels' sources, flash-attn-4's fingerprint, the
    quack-kernels version, the target architecture and the DSL's compiler library (module
    docstring)."""
    from flash_attn.cute.cache_utils import _compute_source_fingerprint

    h = hashlib.sha256()
    for src in _SOURCES:
        h.update(src.name.encode())
        h.update(src.read_bytes())
    h.update(_compute_source_fingerprint().encode())
    h.update(f"quack-kernels={importlib.metadata.version('quack-kernels')}".encode())
    h.update(_target().encode())
    h.update(compiler_dso()[1].encode())
    return h.hexdigest()[:16]


def make_cache():
    """The compiled-kernel cache of the cute backend: in memory only, or also on disk under
    ``$FP4_ATTENTION_CUTE_CACHE_DIR/<fingerprint>`` when the variable is set. ``key in cache``
    loads a kernel from disk; ``cache[key] = compiled`` also exports it. Keys are tuples of Python
    scalars and tuples (pickled and hashed for the file name).

    Raises:
        ValueError: the variable names an existing path that is not a directory, or a directory
            that cannot be created or written.
    """
    from flash_attn.cute.cache_utils import JITCache, JITPersistentCache

    root = os.environ.get(ENV)
    if not root:
        return JITCache()
    path = Path(root).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{ENV}={root} is not a directory; unset it or point it at a directory")
    try:
        return JITPersistentCache(path / source_fingerprint())
    except OSError as err:  # a parent that is a file, no permission: the variable is the thing to fix
        raise ValueError(
            f"{ENV}={root}: cannot create the kernel cache there "
            f"({type(err).__name__}: {err.strerror or err}); unset it or point it at a writable directory"
        ) from None
