"""The backend registry: which attention runs, decided in one place.

Every backend declares what it runs in a :class:`~fp4_attention.backends.base.BackendSpec` (a
light module: ``reference``, ``triton/__init__``, ``cute/__init__``, ``fa4/__init__``); its
implementation is imported on first use. From those declarations the registry

* resolves ``backend="auto"`` (:func:`resolve_backend`): the highest-priority backend that runs the
  recipe on the device and imports (the reference backend on a CPU), with the reason in words;
* produces every "unsupported" error (:func:`check_supported`), naming the backends that do run
  the request (nothing falls back silently; contract §4 case 12);
* validates a config without importing any kernel (:func:`backend_spec`).

Adding a backend: a folder under ``fp4_attention/backends/`` whose ``__init__`` defines ``SPEC``,
and its name in :data:`BUILTIN`. A third-party backend calls :func:`register_backend` with an
object that has a ``spec`` attribute.
"""

from __future__ import annotations

import importlib

import torch

from ..numerics.recipes import Recipe, get_recipe
from .base import Backend, BackendSpec, SavedState, UnsupportedError, flatten_state, restore_state

__all__ = [
    "AUTO",
    "BUILTIN",
    "Backend",
    "BackendSpec",
    "SavedState",
    "UnsupportedError",
    "alternatives",
    "available_backends",
    "backend_spec",
    "check_supported",
    "flatten_state",
    "get_backend",
    "register_backend",
    "resolve_backend",
    "restore_state",
]

AUTO = "auto"
# Modules (relative to this package) whose ``SPEC`` declares a built-in backend.
BUILTIN = {"reference": ".reference", "triton": ".triton", "cute": ".cute", "fa4": ".fa4"}

_SPECS: dict[str, BackendSpec] = {}
_INSTANCES: dict[str, Backend] = {}


def _load_builtin_specs() -> None:
    for name, module in BUILTIN.items():
        if name not in _SPECS:
            _SPECS[name] = importlib.import_module(module, __name__).SPEC


def register_backend(backend: Backend, *, replace: bool = False) -> None:
    """Register an implemented backend object under ``backend.spec.name``.

    Raises:
        TypeError: the object has no ``spec`` (:class:`BackendSpec`).
        ValueError: the name is taken and ``replace`` is False.
    """
    spec = getattr(backend, "spec", None)
    if not isinstance(spec, BackendSpec):
        raise TypeError(f"a backend needs a `spec` attribute of type BackendSpec, got {type(spec).__name__}")
    _load_builtin_specs()
    if spec.name == AUTO or (spec.name in _SPECS and not replace):
        raise ValueError(f"attention backend {spec.name!r} is already registered (or reserved)")
    _SPECS[spec.name] = spec
    _INSTANCES[spec.name] = backend


def available_backends() -> list[str]:
    """Names of every declared backend (importable or not), sorted."""
    _load_builtin_specs()
    return sorted(_SPECS)


def backend_spec(name: str) -> BackendSpec:
    """The declaration of backend ``name`` (imports no kernel).

    Raises:
        ValueError: unknown name (lists the known ones).
    """
    _load_builtin_specs()
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; known: {AUTO}, {', '.join(sorted(_SPECS))}"
        ) from None


def get_backend(name: str) -> Backend:
    """The implementation of backend ``name``, importing it on first use.

    Raises:
        ValueError: unknown name, an implementation that cannot be imported (the message says
            what to install and which backends run instead), or one that refuses its configuration
            on import (a ValueError of its own, e.g. a bad environment variable: passed on as it is,
            without the install hint).
    """
    spec = backend_spec(name)
    if name not in _INSTANCES:
        module, _, cls = spec.impl.partition(":")
        try:
            impl = getattr(importlib.import_module(module), cls)
        except ValueError as err:  # installed, but its configuration is wrong: reinstalling won't help
            raise ValueError(f"attention backend {name!r}: {err}") from err
        except Exception as err:  # missing (ImportError) or installed but broken (RuntimeError, OSError)
            hint = f"; {spec.install_hint}" if spec.install_hint else ""
            raise ValueError(
                f"attention backend {name!r} cannot be imported ({err}){hint}; or use "
                f"backend='reference' (any device) or 'auto'"
            ) from err
        _INSTANCES[name] = impl()
    return _INSTANCES[name]


def _runs(
    spec: BackendSpec,
    recipe: Recipe,
    device: torch.device | None,
    head_dim: int | None,
    training: bool,
    deterministic: bool = False,
    batch_heads: int | None = None,
) -> str | None:
    """Why ``spec`` cannot run the request, or None if it can (from its declaration alone; a None
    device, head dim or ``batch_heads`` (B * Hq) is not checked)."""
    if recipe.name not in spec.recipes:
        return f"runs recipes {', '.join(spec.recipes)}, not {recipe.name!r}"
    if recipe.qk_rotation is not None and recipe.qk_rotation.kind not in spec.qk_rotations:
        return f"does not implement qk_rotation={recipe.qk_rotation.kind!r}"
    if recipe.k_scale_keys not in spec.k_scale_keys:
        return (
            f"does not implement k_scale_keys={recipe.k_scale_keys} (K scales per {recipe.k_scale_keys} keys)"
        )
    if device is None:
        pass
    elif device.type not in spec.devices:
        return f"needs a {' or '.join(d.upper() for d in spec.devices)} device, not {device.type}"
    elif device.type == "cuda" and spec.cuda_capability is not None:
        cap = torch.cuda.get_device_capability(device)
        if not spec.runs_capability(cap):
            return f"runs on {spec.capability_text()}, this GPU is sm_{cap[0]}{cap[1]}"
    if head_dim is not None and not spec.runs_head_dim(head_dim):
        return f"runs head dims {spec.head_dims_text()}, not {head_dim}"
    if batch_heads is not None and spec.max_batch_heads is not None and batch_heads > spec.max_batch_heads:
        return (
            f"runs B * Hq (batch times query heads) up to {spec.max_batch_heads:,}, the programs of a CUDA "
            f"grid's axis, not {batch_heads:,} (a smaller micro-batch fits)"
        )
    if training and recipe.trainable and not spec.backward:
        return "has no backward (forward only)"
    if training and deterministic and recipe.name in spec.nondeterministic:
        return (
            f"accumulates the {recipe.name} backward with FP32 atomics (not bitwise reproducible), which "
            "deterministic mode (torch.use_deterministic_algorithms, runtime.deterministic) refuses"
        )
    return None


def alternatives(
    recipe: str | Recipe,
    device: torch.device | str | None = None,
    head_dim: int | None = None,
    *,
    training: bool = False,
    exclude: str | None = None,
    deterministic: bool = False,
    batch_heads: int | None = None,
) -> list[str]:
    """Names of the backends whose declaration runs the request (any device if ``device`` is None),
    highest priority for the recipe first; with ``deterministic`` (and ``training``), only those
    whose backward of the recipe is bitwise reproducible; with ``batch_heads``, only those that take
    that B * Hq."""
    rec, dev = get_recipe(recipe), None if device is None else torch.device(device)
    _load_builtin_specs()
    ranked = sorted(_SPECS.values(), key=lambda s: (-s.priority_for(rec.name), s.name))
    return [
        s.name
        for s in ranked
        if s.name != exclude and _runs(s, rec, dev, head_dim, training, deterministic, batch_heads) is None
    ]


def _unsupported(
    spec: BackendSpec,
    reason: str,
    recipe: Recipe,
    device: torch.device,
    head_dim: int | None,
    training: bool,
    deterministic: bool = False,
    batch_heads: int | None = None,
) -> UnsupportedError:
    others = alternatives(
        recipe,
        device,
        head_dim,
        training=training,
        exclude=spec.name,
        deterministic=deterministic,
        batch_heads=batch_heads,
    )
    instead = (
        f"use {' or '.join(f'backend={o!r}' for o in others)}" if others else "no registered backend runs it"
    )
    return UnsupportedError(f"{spec.name} backend {reason}; {instead}")


def deterministic_mode() -> bool:
    """Whether torch's deterministic mode is on and strict (``torch.use_deterministic_algorithms(True)``
    without ``warn_only``: that one asks for warnings, and gets the fastest backend): then only
    backends whose backward is bitwise reproducible run (``BackendSpec.nondeterministic``)."""
    strict = not torch.is_deterministic_algorithms_warn_only_enabled()
    return torch.are_deterministic_algorithms_enabled() and strict


def check_supported(
    name: str, recipe: str | Recipe, q: torch.Tensor, *, training: bool = False, deterministic: bool = False
) -> None:
    """Raise :class:`UnsupportedError` naming the alternatives if backend ``name`` cannot run
    ``recipe`` on ``q``'s device and head dim (``q`` is ``[..., D]``; a 4-D ``q`` is ``[B, Hq, Sq,
    D]``, whose B * Hq is checked against ``max_batch_heads``), or, with ``deterministic`` and
    ``training``, cannot run its backward bitwise reproducibly."""
    spec, rec = backend_spec(name), get_recipe(recipe)
    bh = q.shape[0] * q.shape[1] if q.dim() == 4 else None
    reason = _runs(spec, rec, q.device, q.shape[-1], training, deterministic, bh)
    if reason is not None:
        raise _unsupported(spec, reason, rec, q.device, q.shape[-1], training, deterministic, bh)


def resolve_backend(
    requested: str,
    recipe: str | Recipe,
    device: torch.device | str,
    *,
    training: bool = True,
    deterministic: bool = False,
) -> tuple[str, str]:
    """``(backend name, why)`` for a configured backend on ``device``; the backend is imported.

    ``auto``: the highest-priority declared backend that runs the recipe on the device and imports
    (``why`` names the ones passed over and the reason). A named backend must run it. With
    ``deterministic`` (and ``training``): only backends whose backward of the recipe is bitwise
    reproducible (``BackendSpec.nondeterministic``).

    Raises:
        UnsupportedError: the named backend cannot run the recipe on this device (alternatives named),
            or ``device`` is a CUDA device and torch sees no CUDA GPU here.
        ValueError: unknown name, or a named backend that cannot be imported.
    """
    rec, dev = get_recipe(recipe), torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedError(
            f"attention backend for device {str(dev)!r} asked for, but torch sees no CUDA GPU here "
            "(torch.cuda.is_available() is False: no GPU, no driver, or a CPU-only torch); resolve for "
            "device 'cpu' (the reference backend) or run on a GPU machine"
        )
    if requested != AUTO:
        spec = backend_spec(requested)
        reason = _runs(spec, rec, dev, None, training, deterministic)
        if reason is not None:
            raise _unsupported(spec, reason, rec, dev, None, training, deterministic)
        get_backend(requested)
        return requested, "configured"
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    passed = []
    if training and deterministic:
        passed += [
            f"{s} (its {rec.name} backward is not bitwise reproducible)"
            for s in alternatives(rec, dev, training=training)
            if s not in alternatives(rec, dev, training=training, deterministic=True)
        ]
    for name in alternatives(rec, dev, training=training, deterministic=deterministic):
        try:
            get_backend(name)
        except ValueError as err:
            passed.append(f"{name} not importable ({err.__cause__ or err})")
            continue
        skipped = f"; passed over: {'; '.join(passed)}" if passed else ""
        return name, f"auto: highest-priority backend for {rec.name} on {where}{skipped}"
    raise UnsupportedError(
        f"no attention backend runs recipe {rec.name!r} on {where}"
        + (f" ({'; '.join(passed)})" if passed else "")
    )
