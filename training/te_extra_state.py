"""Transformer Engine's FP8 delayed-scaling state on resume: a pickle, vetted before TE loads it.

TE keeps the scaling state of its FP8 modules (with delayed scaling: per-GEMM scales and amax
histories) in each module's ``_extra_state``: ``pickle.dumps`` of a dict holding the recipe object,
CPU tensors and plain values. Since 2.20, TE's ``set_extra_state`` refuses to unpickle such a
payload unless ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1`` (a pickle can run code), so a TE FP8 run
with delayed scaling could not resume (found on the H200, ``results/te_h200/``). Current scaling
stores an empty extra state and is not affected.

This module keeps TE's own unpickling data-only in the sense of ``torch.load(weights_only=True)``:
it unpickles every ``_extra_state`` payload first with an unpickler that resolves only an
allow-list of globals (the recipe classes, TE's format enum, OrderedDict, tensor rebuilding; a
tensor's storage bytes are read with ``torch.load(weights_only=True)``) and raises for anything
else. What TE then unpickles, with the opt-in set for that call alone, is not the checkpoint's bytes
but ``pickle.dumps`` of the objects the vetting built: no byte of the file reaches TE's
``pickle.loads``.

The outer layer, the torch_dist files megatron-core's ``dist_checkpointing.load`` reads these extra
states from (``.metadata`` and the ShardedObjects' ``torch.save`` bytes, which torch DCP unpickles
without restriction), is vetted before that load by ``training/torch_dist_vetting.py``.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Iterator, MutableMapping

import torch

from .checkpoint import UnsafeCheckpointError
from .engine import describe_load_error

__all__ = ["UNSAFE_PICKLE_ENV", "UnsafeExtraStateError", "allow_vetted_te_extra_state", "vet_extra_state"]

UNSAFE_PICKLE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"


def _load_storage_bytes(data: bytes):
    """A tensor storage pickled by ``torch.storage`` (``torch.save`` bytes), read without code."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


# (module, name) -> what the vetting unpickler builds in its place (None: import the real one)
_ALLOWED = {
    ("collections", "OrderedDict"): None,
    ("torch._utils", "_rebuild_tensor_v2"): None,
    ("torch.storage", "_load_from_bytes"): _load_storage_bytes,
    ("megatron.core.safe_globals", "safe_load_from_bytes"): _load_storage_bytes,
    ("transformer_engine.common.recipe", "DelayedScaling"): None,
    ("transformer_engine.common.recipe", "Format"): None,
    ("transformer_engine.common.recipe", "_FormatHelper"): None,
    ("megatron.core.extensions.transformer_engine", "TEDelayedScaling"): None,
}


class UnsafeExtraStateError(UnsafeCheckpointError):
    """A checkpoint's Transformer Engine extra state would build something outside the allow-list."""


class _VettingUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise UnsafeExtraStateError(f"it references {module}.{name}, which is not allowed")
        replacement = _ALLOWED[(module, name)]
        return replacement if replacement is not None else super().find_class(module, name)


def vet_extra_state(key: str, value):
    """Unpickle one ``_extra_state`` value with the allow-list unpickler and return what TE may load
    in its place: ``value`` itself when it holds no pickle (``None``, an empty tensor), else a uint8
    tensor of ``pickle.dumps`` of the objects the vetting built.

    Args:
        key: its state-dict key, for the message.
        value: what the checkpoint holds for it; TE writes a 1-D ``torch.uint8`` tensor of pickle
            bytes (``TransformerEngineBaseModule.get_extra_state``), and its ``set_extra_state``
            unpickles the bytes of a tensor of any dtype, so every non-empty tensor is vetted.
    Raises:
        UnsafeExtraStateError: the pickle references a global outside the allow-list, its tensor
            storage is not ``weights_only``-loadable, it does not unpickle, or it is TE's deprecated
            ``io.BytesIO`` form (a ``torch.save`` blob loaded with ``weights_only=False``), or it
            is neither ``None`` nor a tensor.
    """
    if isinstance(value, io.BytesIO):
        raise UnsafeExtraStateError(
            f"{key}: Transformer Engine extra state in the deprecated io.BytesIO form, which TE loads "
            "with torch.load(weights_only=False); resume from a checkpoint written by this version"
        )
    if value is None or (isinstance(value, torch.Tensor) and value.numel() == 0):
        return value
    if not isinstance(value, torch.Tensor):
        raise UnsafeExtraStateError(
            f"{key}: Transformer Engine extra state of type {type(value).__name__}, not a tensor of "
            "pickle bytes; resume from a checkpoint written by this version"
        )
    data = value.detach().cpu().contiguous().numpy().tobytes()
    try:
        built = _VettingUnpickler(io.BytesIO(data)).load()
    except UnsafeExtraStateError as err:
        raise UnsafeExtraStateError(
            f"{key}: Transformer Engine extra state refused: {err} "
            "(this project loads only FP8 scaling state built from tensors, TE's recipe classes and "
            "plain values; a checkpoint from another source may run code when unpickled)"
        ) from None
    except Exception as err:  # a weights_only refusal of a nested storage, truncated bytes, ...
        raise UnsafeExtraStateError(
            f"{key}: the checkpoint's Transformer Engine extra state does not unpickle as FP8 "
            f"scaling state ({describe_load_error(err)})"
        ) from None
    return torch.frombuffer(bytearray(pickle.dumps(built)), dtype=torch.uint8)


@contextlib.contextmanager
def allow_vetted_te_extra_state(model_state: MutableMapping) -> Iterator[None]:
    """Vet every ``*._extra_state`` entry of ``model_state`` (:func:`vet_extra_state`), replace it in
    ``model_state`` by the re-pickled objects the vetting built, then let TE unpickle them inside the
    ``with`` block: ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1`` there, its previous value (or absence)
    restored after, also on error.

        with allow_vetted_te_extra_state(state["model"]):
            model.load_state_dict(state["model"], strict=True)

    Raises:
        UnsafeExtraStateError: as :func:`vet_extra_state`, before anything is loaded.
    """
    vetted = {k: vet_extra_state(k, v) for k, v in model_state.items() if k.endswith("_extra_state")}
    model_state.update(vetted)
    before = os.environ.get(UNSAFE_PICKLE_ENV)
    os.environ[UNSAFE_PICKLE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(UNSAFE_PICKLE_ENV, None)
        else:
            os.environ[UNSAFE_PICKLE_ENV] = before
