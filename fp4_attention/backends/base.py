"""What every attention backend is: its declaration (:class:`BackendSpec`), its protocol
(:class:`Backend`) and the one state it saves for backward (:class:`SavedState`).

A backend *declares* what it runs as data (recipes, head dims, devices, CUDA capabilities, whether
it has a backward, its options, its rank for ``backend="auto"``) in a module that imports nothing
heavy, so that the registry (``fp4_attention.backends``) can resolve ``auto``, validate a config and
word every "unsupported" error with the alternatives without importing Triton or the CUTLASS DSL.
The implementation (``spec.impl``) is imported on first use.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..numerics.operands import SavedState

__all__ = ["Backend", "BackendSpec", "SavedState", "UnsupportedError", "flatten_state", "restore_state"]

# The reference backend's head-dim rule, used for specs with ``head_dims=None``.
MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 16


class UnsupportedError(ValueError):
    """A backend cannot run the requested recipe, shape, dtype or device (the message names the
    backends that can)."""


@dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """What a backend runs, as data.

    Attributes:
        name: the registry name (``attention(..., backend=name)``, YAML ``attention.backend``).
        impl: ``"module:Class"`` of the implementation, imported on first use.
        recipes: names of the recipes it runs (forward; backward too for trainable recipes when
            ``backward`` is True).
        backward: whether it computes gradients of its trainable recipes.
        devices: torch device types, ``"cpu"`` and/or ``"cuda"``.
        cuda_capability: inclusive ``((major, minor), (major, minor))`` range of CUDA compute
            capabilities; None = any.
        head_dims: supported head dims; None = any multiple of 16 up to 256.
        max_batch_heads: the largest B * Hq (batch times query heads) its kernels take, when they
            put it on one axis of a CUDA grid (65,535 programs on the y axis); None = no limit.
        options: keyword options its ``forward`` / ``backward`` accept (benchmarks and tests).
        qk_rotations: the Q/K rotations it implements (``Recipe.qk_rotation.kind``, e.g.
            ``"hadamard"``); a recipe with another rotation is refused by the registry.
        fused_rope: whether its ``forward`` takes ``rope`` (a
            :class:`~fp4_attention.numerics.rope.RoPETables`) and applies RoPE to Q and K itself, in
            its quantizers where it can (``attention(..., rope=...)``); for a backend without it
            the interface applies RoPE before calling it (same numbers, one more pass over Q and
            K). Either way the gradients the backend returns are of the RoPE'd Q/K, and the
            interface rotates them back.
        k_scale_keys: the ``Recipe.k_scale_keys`` it implements (keys per K scale; 1 = per token);
            a recipe with another is refused by the registry.
        priority: rank for ``backend="auto"``: among the backends that run the recipe on the
            device, the highest priority wins (ordered by measured forward+backward speed).
        recipe_priority: ``(recipe name, priority)`` pairs that override ``priority`` for a recipe
            (a backend fast for one recipe and not for another).
        lse_grad: whether its ``backward`` takes ``dlse``, the gradient of the LSE that
            ``attention(..., return_lse=True)`` returns (FP32 ``[B, Hq, Sq]``, or None where the
            LSE is not in the loss); the interface refuses that gradient for a backend without it.
        nondeterministic: recipes whose backward is not bitwise reproducible run to run (FP32
            atomic accumulation); refused under ``torch.use_deterministic_algorithms(True)`` (the
            trainer's ``runtime.deterministic``) and passed over there by ``auto``.
        install_hint: what to install when ``impl`` cannot be imported.
        summary: one line for listings and errors.
    """

    name: str
    impl: str
    recipes: tuple[str, ...]
    backward: bool = True
    devices: tuple[str, ...] = ("cuda",)
    cuda_capability: tuple[tuple[int, int], tuple[int, int]] | None = None
    head_dims: tuple[int, ...] | None = None
    max_batch_heads: int | None = None
    options: tuple[str, ...] = ()
    qk_rotations: tuple[str, ...] = ()
    fused_rope: bool = False
    k_scale_keys: tuple[int, ...] = (1,)
    priority: int = 0
    recipe_priority: tuple[tuple[str, int], ...] = ()
    lse_grad: bool = False
    nondeterministic: tuple[str, ...] = ()
    install_hint: str = ""
    summary: str = ""

    def priority_for(self, recipe: str) -> int:
        """``priority``, or this recipe's entry of ``recipe_priority``."""
        return dict(self.recipe_priority).get(recipe, self.priority)

    def runs_head_dim(self, d: int) -> bool:
        if self.head_dims is None:
            return d % HEAD_DIM_MULTIPLE == 0 and 0 < d <= MAX_HEAD_DIM
        return d in self.head_dims

    def head_dims_text(self) -> str:
        if self.head_dims is None:
            return f"multiples of {HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM}"
        return ", ".join(map(str, self.head_dims))

    def runs_capability(self, capability: tuple[int, int]) -> bool:
        if self.cuda_capability is None:
            return True
        low, high = self.cuda_capability
        return low <= tuple(capability) <= high

    def capability_text(self) -> str:
        if self.cuda_capability is None:
            return "any CUDA GPU"
        (a, b), (c, d) = self.cuda_capability
        return f"sm_{a}{b}" if (a, b) == (c, d) else f"sm_{a}{b} to sm_{c}{d}"


class Backend(Protocol):
    """An attention implementation. Tensors are ``[B, H, S, D]``; inputs have passed
    ``fp4_attention.interface`` validation and the registry's :func:`check_supported`."""

    spec: BackendSpec

    def forward(self, q, k, v, recipe, *, causal: bool, softmax_scale: float, **options):
        """-> (out BF16 ``[B, Hq, Sq, D]``, lse FP32 ``[B, Hq, Sq]``, :class:`SavedState`). With
        ``spec.fused_rope`` it also takes ``rope=`` (None or a ``RoPETables``): attention of the
        RoPE'd Q and K."""

    def backward(self, state: SavedState, dout, recipe, *, causal: bool, softmax_scale: float, **options):
        """-> (dq, dk, dv) BF16, shaped as q, k, v."""


def flatten_state(state: Any) -> tuple[Any, list[torch.Tensor]]:
    """Split a (nested) dataclass state into a tensor-free skeleton and the list of its tensors, so
    that the tensors go through autograd's ``save_for_backward``. Fields that are neither tensors nor
    dataclasses (ints, bools, None, strings) stay in the skeleton as they are. Runs once per
    attention forward: the field names of each dataclass type are looked up once per process."""
    tensors: list[torch.Tensor] = []
    return _flatten_state(state, tensors), tensors


def restore_state(skeleton: Any, tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> Any:
    """Inverse of :func:`flatten_state`: the same dataclass types, each tensor in its field."""
    return _restore_state(skeleton, tensors)


class _Ref(int):
    """The index of a tensor in :func:`flatten_state`'s list (a type of its own, so that an int
    field of a state stays an int)."""


class _Node(tuple):
    """A flattened dataclass: ``(type, ((field name, flattened value), ...))``."""


@functools.cache
def _field_names(cls: type) -> tuple[str, ...] | None:
    """The field names of dataclass type ``cls`` (None for any other type), computed once per type."""
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None


_REFS = tuple(_Ref(i) for i in range(64))  # made once: a state holds a dozen tensors


def _ref(i: int) -> _Ref:
    return _REFS[i] if i < len(_REFS) else _Ref(i)


def _flatten_state(obj: Any, out: list[torch.Tensor]) -> Any:
    # loops rather than generator expressions, tensor fields without a call of their own: this
    # runs on every attention forward (bench/interface_overhead.py)
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        return _ref(len(out) - 1)
    names = _field_names(type(obj))
    if names is None:
        return obj
    fields = []
    for n in names:
        v = getattr(obj, n)
        if isinstance(v, torch.Tensor):
            out.append(v)
            fields.append((n, _ref(len(out) - 1)))
        else:
            fields.append((n, _flatten_state(v, out)))
    return _Node((type(obj), tuple(fields)))


def _restore_state(obj: Any, tensors) -> Any:
    kind = type(obj)
    if kind is _Ref:
        return tensors[obj]
    if kind is not _Node:
        return obj
    cls, fields = obj
    kwargs = {}
    for n, v in fields:
        kind = type(v)
        kwargs[n] = tensors[v] if kind is _Ref else (_restore_state(v, tensors) if kind is _Node else v)
    return cls(**kwargs)
