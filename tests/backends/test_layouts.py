"""Allocation in the caller's memory order (``backends.layouts``), on a CPU."""

import torch

from fp4_attention.backends.layouts import empty_in_layout_of


def test_empty_in_layout_of_follows_the_callers_memory_order():
    for perm in ((0, 2, 1, 3), (2, 0, 1, 3), (0, 1, 2, 3)):  # bshd, sbhd, bhsd memory
        inv = [perm.index(i) for i in range(4)]
        like = torch.empty([(2, 8, 300, 128)[i] for i in perm]).permute(*inv)  # a [B, H, S, D] view
        got = empty_in_layout_of(like, (2, 4, 300, 128))  # other heads (GQA K/V), same order
        assert got.shape == (2, 4, 300, 128) and got.dtype == torch.bfloat16
        assert got.permute(*perm).is_contiguous(), (perm, got.stride())


def test_empty_in_layout_of_keeps_the_head_dim_innermost_for_a_broadcast_like():
    """A q expanded over the batch (stride 0) must still give a dense output with a unit last
    stride: the CuTe kernels take the head dim as their static unit-stride mode (TMA)."""
    like = torch.empty(1, 300, 8, 128).expand(2, 300, 8, 128).permute(0, 2, 1, 3)  # bshd, B broadcast
    got = empty_in_layout_of(like, (2, 8, 300, 128))
    assert got.stride(-1) == 1, got.stride()
    assert got.untyped_storage().nbytes() == got.numel() * got.element_size()  # dense
    assert all(s % 128 == 0 for s in got.stride()[:-1]), got.stride()  # 16-byte aligned strides
