"""Triton launches that reuse the compiled kernel: on by default with Triton 3.6 (the version it
was checked against), off with ``FP4_ATTENTION_TRITON_LAUNCH_CACHE=0`` (every launch then goes
through ``JITFunction``, as it does with other Triton versions).

Measured on the H200 (``results/host_launch_cache_h200/``, 2026-12-04): in one process, the cute
``fp8`` training step at B1 with the cache on and off in alternate blocks of 100 steps, the median
host time per step was 1,734 us with it against 1,875 without (-7.5%), all 292 GPU tests of the
Triton quantizers, the dO kernel and the Triton and CuTe backends passing with it on.

A launch through ``JITFunction.__getitem__`` binds and specializes every argument, looks the
compiled kernel up and reads Triton's runtime settings on each call: 46 us of host time per launch
of the dO kernel on the H200, against 15 us for the same compiled kernel launched through
``CompiledKernel`` (``results/host_overhead_h200/``); the cute ``fp8`` step makes 6 such launches
(7 before Q and K were quantized in one).
:class:`CachedLaunch` keeps the compiled kernel per argument key and launches it through
``CompiledKernel.run``, the launcher Triton itself calls.

The key is stricter than Triton's specialization, so a kernel is never reused where Triton would
have compiled another one: the grid; the current device; the ``debug`` and ``instrumentation_mode``
options ``JITFunction.run`` takes from Triton's settings; a tensor by its dtype and whether its
address is a multiple of 16 bytes (Triton's alignment specialization); a float by its bits (a
constexpr float is compiled in; -0.0 and 0.0 compile apart); every other argument, launch options
included, by its type and value (Triton specializes ints on 1, on multiples of 16 and on their
range, and tells True from 1). Keyed by value, the ints make more keys than Triton's classes: a
kernel keeps at most :data:`MAX_KEYS` and starts over past them. A first call
for a key goes through ``JITFunction`` (which compiles or finds the kernel and launches it), so
the two paths run the same compiled code. The cached launch passes no launch metadata and no
hooks; ``JITFunction`` builds the metadata and passes Triton 3.6's hook chains on every launch even
when they are empty. Launches go through ``JITFunction`` every time when the cache is off, when
Triton runs interpreted (the CPU tests), when a launch hook or a pre-run hook is set (profilers
such as Proton use them). Parameters left to their defaults are filled in as ``JITFunction`` does.
Not repeated on a cached launch: ``JITFunction``'s check that the module globals a kernel read at
compile time (``tl.constexpr`` constants) have not changed since; nothing in this package changes
them.
"""

from __future__ import annotations

import os

import torch
import triton
from triton import knobs

__all__ = [
    "ENV",
    "MAX_KEYS",
    "VERIFIED_TRITON",
    "CachedLaunch",
    "cdiv",
    "enabled",
    "interpreted",
    "launch_key",
    "launcher",
]

ENV = "FP4_ATTENTION_TRITON_LAUNCH_CACHE"


# The Triton versions whose launch path (``JITFunction.run`` and ``CompiledKernel.run``'s arguments,
# the ``knobs`` hooks) this module was checked against and GPU-tested with; elsewhere the cache stays
# off unless asked for, and asking for it is refused
VERIFIED_TRITON = ("3.6.",)
_VERIFIED = triton.__version__.startswith(VERIFIED_TRITON)


def enabled() -> bool:
    """Whether the cache is on: ``FP4_ATTENTION_TRITON_LAUNCH_CACHE`` unset (with a Triton of
    :data:`VERIFIED_TRITON`) or ``1``; read at each launch, so a benchmark can compare both paths
    in one process.

    Raises:
        ValueError: a value other than unset, ``0`` or ``1``, or ``1`` with a Triton outside
            :data:`VERIFIED_TRITON` (its launcher's arguments may differ: set 0 or leave it unset)."""
    value = os.environ.get(ENV)
    if value is None:
        return _VERIFIED
    if value not in ("0", "1"):
        raise ValueError(f"{ENV} must be 0 or 1, got {value!r}")
    if value == "1" and not _VERIFIED:
        raise ValueError(
            f"{ENV}=1: the launch cache is verified with Triton "
            f"{', '.join(v + 'x' for v in VERIFIED_TRITON)} only, this is Triton {triton.__version__}; "
            f"set {ENV}=0 or leave it unset (launches then go through JITFunction)"
        )
    return value == "1"


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for a grid's size on the host: ``triton.cdiv`` is a constexpr function whose
    call costs about 2 us of host time (its wrapper unwraps constexprs), on every launch's path."""
    return -(-a // b)


def interpreted() -> bool:
    """Whether Triton runs interpreted (``TRITON_INTERPRET=1``, as Triton's own setting reads it):
    the kernels then take CPU tensors (the CPU tests)."""
    return bool(knobs.runtime.interpret)


def _hooked() -> bool:
    """Whether a launch hook is set: Triton 3.6 keeps them in ``HookChain`` objects (empty by
    default, and then its launcher calls them for nothing); older versions hold None or a callable."""
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


_Tensor = torch.Tensor
# argument classes a key may hold by value: hashed by value, so equal keys mean equal arguments
_BY_VALUE = (int, float, bool, str, type(None))


def _key(values) -> list:
    """The key of a sequence of launch arguments (module docstring): a ``torch.Tensor`` by its dtype
    and 16-byte alignment, a float by its bits (``float.hex``: -0.0 is not 0.0, a NaN equals a NaN),
    anything else by its class and value. One list comprehension with no ``isinstance``
    (``torch.Tensor``'s metaclass makes that slow): it runs on every launch. A tensor subclass falls
    to class and value, which a miss then refuses to cache (:func:`_cacheable`)."""
    return [
        (a.dtype, not a.data_ptr() & 15)
        if a.__class__ is _Tensor
        else (float, a.hex())
        if a.__class__ is float
        else (a.__class__, a)
        for a in values
    ]


def _cacheable(values) -> bool:
    """Whether every argument is a plain tensor or of a class in ``_BY_VALUE``: a key holding anything
    else (a tensor subclass, hashed by identity) would never be hit again, so it is not stored."""
    return all(a.__class__ is _Tensor or a.__class__ in _BY_VALUE for a in values)


# keys kept per kernel at most: the ints are keyed by value (stricter than Triton's classes), so a
# run whose lengths keep changing would grow the cache without end; past this it starts over
MAX_KEYS = 1024


def launch_key(fn, grid: tuple, device: int, args: tuple, kwargs: dict) -> tuple:
    """The cache key of one launch of ``fn`` (module docstring): the grid, the device, the ``debug``
    and ``instrumentation_mode`` options as ``JITFunction.run`` forms them from Triton's settings,
    and the arguments (:func:`_key`), keyword names included. Equal keys mean equal Triton
    specializations (tests/backends/test_triton_launch_cache.py checks it against Triton's binder)."""
    return (
        grid,
        device,
        kwargs.get("debug", fn.debug) or knobs.runtime.debug,  # JITFunction.run's expression
        knobs.compilation.instrumentation_mode,
        *_key(args),
        *kwargs,
        *_key(kwargs.values()),
    )


class CachedLaunch:
    """``CachedLaunch(jit_fn)[grid](*args, **kwargs)`` launches ``jit_fn`` as
    ``jit_fn[grid](*args, **kwargs)`` does (module docstring).

    Args:
        fn: a ``triton.jit`` function (``JITFunction``).
    """

    def __init__(self, fn):
        self.fn = fn
        self.cache: dict = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(tuple(grid), args, kwargs)

    def launch(self, grid: tuple, args: tuple, kwargs: dict):
        """Launch on ``grid`` (1 to 3 ints) with the kernel's positional and keyword arguments
        (constexprs and launch options such as ``num_warps`` by keyword)."""
        if not enabled():  # switched off: nothing more on the launch path than this check
            return self.fn[grid](*args, **kwargs)
        if interpreted() or _hooked() or getattr(self.fn, "pre_run_hooks", None):
            return self.fn[grid](*args, **kwargs)
        device = torch.cuda.current_device()  # the compiled kernel's module is loaded per device
        # the options JITFunction.run adds from Triton's settings (they select the compiled kernel)
        key = launch_key(self.fn, grid, device, args, kwargs)
        hit = self.cache.get(key)
        if hit is None:
            compiled = self.fn[grid](*args, **kwargs)
            tail = self._tail(len(args), kwargs)
            if compiled is not None and tail is not None and _cacheable(args) and _cacheable(kwargs.values()):
                if len(self.cache) >= MAX_KEYS:
                    self.cache.clear()
                self.cache[key] = (compiled, tail)
            return compiled
        compiled, tail = hit
        full = (*args, *(kwargs[n] if keyword else value for n, keyword, value in tail))
        g = grid + (1,) * (3 - len(grid))
        stream = torch._C._cuda_getCurrentRawStream(device)  # what Triton's driver reads
        compiled.run(*g, stream, compiled.function, compiled.packed_metadata, None, None, None, *full)
        return compiled

    def _tail(self, n_args: int, kwargs: dict):
        """The parameters after the positional ones as ``(name, by keyword, default)``, in the
        kernel's order (JITFunction passes every parameter, defaults filled in, to the launcher);
        None if one is neither given nor has a default (JITFunction raised for it already)."""
        tail = []
        for p in self.fn.params[n_args:]:
            if p.name in kwargs:
                tail.append((p.name, True, None))
            elif p.has_default:
                tail.append((p.name, False, p.default))
            else:
                return None
        return tuple(tail)


_LAUNCHERS: dict = {}


def launcher(fn) -> CachedLaunch:
    """The :class:`CachedLaunch` of ``fn`` (one per kernel, so its cache lives as long as the process)."""
    got = _LAUNCHERS.get(id(fn))
    if got is None:
        got = _LAUNCHERS[id(fn)] = CachedLaunch(fn)
    return got
