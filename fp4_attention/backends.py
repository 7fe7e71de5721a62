"""Backend registry: who computes a recipe (``reference`` here; GPU backends register later).

A backend is an object with

* ``name: str``
* ``check(recipe, q, k, v) -> None``: raise ``UnsupportedError`` (naming an alternative) when it
  cannot run this recipe/shape/dtype/device. Nothing falls back silently (contract §4 case 12).
* ``forward(q, k, v, recipe, *, causal, softmax_scale, **options) -> (out, lse, state)`` on
  ``[B, H, S, D]`` tensors: out BF16, lse FP32 ``[B, Hq, Sq]``, state = what backward needs.
* ``backward(state, dout, recipe, *, causal, softmax_scale, **options) -> (dq, dk, dv)``.

The state is a (nested) dataclass of tensors; :func:`flatten_state` / :func:`restore_state` move
its tensors through autograd's ``save_for_backward``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import torch

from .recipes import Recipe
from .reference import DEFAULT_BLOCK_N, ReferenceState, reference_backward, reference_forward

__all__ = [
    "Backend",
    "ReferenceBackend",
    "UnsupportedError",
    "available_backends",
    "flatten_state",
    "get_backend",
    "register_backend",
    "restore_state",
]


class UnsupportedError(ValueError):
    """A backend cannot run the requested recipe, shape, dtype or device."""


class Backend(Protocol):
    name: str

    def check(self, recipe: Recipe, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...

    def forward(self, q, k, v, recipe: Recipe, *, causal: bool, softmax_scale: float, **options): ...

    def backward(self, state: Any, dout, recipe: Recipe, *, causal: bool, softmax_scale: float, **options): ...


_BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend, *, replace: bool = False) -> None:
    """Register ``backend`` under ``backend.name``.

    Raises:
        ValueError: the name is taken and ``replace`` is False.
    """
    if backend.name in _BACKENDS and not replace:
        raise ValueError(f"attention backend {backend.name!r} is already registered")
    _BACKENDS[backend.name] = backend


# Backends that live in their own module and register themselves when it is imported.
_LAZY = {"triton": "fp4_attention.triton_backend", "cute": "fp4_attention.cute_backend",
         "fa4": "fp4_attention.fa4_backend"}


def get_backend(name: str) -> Backend:
    """Look up a backend by name, importing the GPU backends' modules on first use.

    Raises:
        ValueError: unknown name (lists the known backends), or a known backend whose module cannot
            be imported (the message says what is missing).
    """
    if name not in _BACKENDS and name in _LAZY:
        import importlib

        try:
            importlib.import_module(_LAZY[name])
        except ImportError as err:
            raise ValueError(f"attention backend {name!r} cannot be imported ({err}); the GPU backends need a "
                             "CUDA build of torch (and their extras); use backend='reference'") from err
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"unknown attention backend {name!r}; known: {', '.join(sorted(set(_BACKENDS) | set(_LAZY)))}"
        ) from None


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def flatten_state(state: Any) -> tuple[Any, list[torch.Tensor]]:
    """Split a dataclass state into a tensor-free skeleton and the list of its tensors."""
    tensors: list[torch.Tensor] = []
    return _flatten_state(state, tensors), tensors


def restore_state(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """Inverse of :func:`flatten_state`."""
    return _restore_state(skeleton, list(tensors))


def _flatten_state(obj: Any, out: list[torch.Tensor]) -> Any:
    """Replace every tensor inside (nested frozen) dataclasses by its index in ``out``."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        return len(out) - 1
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{f.name: _flatten_state(getattr(obj, f.name), out)
                                           for f in dataclasses.fields(obj)
                                           if isinstance(getattr(obj, f.name), torch.Tensor)
                                           or dataclasses.is_dataclass(getattr(obj, f.name))})
    return obj


def _restore_state(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, int) and not isinstance(obj, bool):
        return tensors[obj]
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{f.name: _restore_state(getattr(obj, f.name), tensors)
                                           for f in dataclasses.fields(obj)
                                           if isinstance(getattr(obj, f.name), int)
                                           and not isinstance(getattr(obj, f.name), bool)
                                           or dataclasses.is_dataclass(getattr(obj, f.name))})
    return obj


class ReferenceBackend:
    """Pure-torch tiled reference (``reference.py``): every recipe, any device, slow.

    Options: ``block_n`` (keys per tile, default 128), ``rescale_threshold`` (log2 units, default 0).
    """

    name = "reference"
    max_head_dim = 256

    def check(self, recipe: Recipe, q, k, v) -> None:
        d = q.shape[-1]
        if d > self.max_head_dim or d % 16:
            raise UnsupportedError(
                f"reference backend: head dim {d} unsupported (need a multiple of 16 up to {self.max_head_dim})"
            )

    def forward(self, q, k, v, recipe, *, causal, softmax_scale, block_n=DEFAULT_BLOCK_N, rescale_threshold=0.0):
        return reference_forward(q, k, v, recipe, causal=causal, softmax_scale=softmax_scale,
                                 block_n=block_n, rescale_threshold=rescale_threshold)

    def backward(self, state: ReferenceState, dout, recipe, *, causal, softmax_scale, block_n=DEFAULT_BLOCK_N,
                 rescale_threshold=0.0):
        return reference_backward(state, dout, recipe, causal=causal, softmax_scale=softmax_scale, block_n=block_n)


register_backend(ReferenceBackend())
