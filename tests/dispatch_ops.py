"""The aten ops a piece of host code dispatches (``TorchDispatchMode``): on a GPU each op that makes
or fills a tensor is a kernel launch, so the tests count them on the CPU."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

# ops that write a constant into a tensor (each a fill kernel on a GPU)
FILL_OPS = ("zeros", "zeros_like", "zero_", "fill_", "full", "full_like", "new_zeros", "new_full")


class OpNames(TorchDispatchMode):
    """``with OpNames() as ops: ...`` records the name of every aten op dispatched inside, in order,
    in ``ops.names``."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))
