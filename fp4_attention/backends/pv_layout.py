"""Key order of the E4M3 V operand of the ``cute`` backend's PV wgmma (pure torch; no GPU needed).

Hopper's wgmma accumulator gives thread q of each quad the score columns {2q, 2q+1, 8+2q, 9+2q}
of every 16 keys, while the register A operand of an 8-bit wgmma wants k = 4q..4q+3 from that
thread. ``cute/fwd_sm90.py`` hands the accumulator registers over in their own order (no shuffle) and
V's keys are permuted to match: within each 16 keys, slot k of the operand holds key
``V_PERM16[k]``. PV sums over keys, so the product is unchanged.
"""

from __future__ import annotations

import torch

__all__ = ["V_PERM16", "V_UNPERM16", "padded_keys", "permute_v_for_pv", "unpermute_v_keys"]

V_PERM16 = tuple(2 * (k // 4) + (k % 4) % 2 + 8 * ((k % 4) // 2) for k in range(16))
V_UNPERM16 = tuple(sorted(range(16), key=lambda k: V_PERM16[k]))  # key j sits in slot V_UNPERM16[j]


def padded_keys(seq_k: int) -> int:
    """Keys of the permuted operand: ``seq_k`` rounded up to a multiple of 16 (the padding keys are zero)."""
    return -(-seq_k // 16) * 16


_INDEX: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}


def _index(order: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``order`` as an index tensor on ``device``, made once per device: building it per call is a
    host-to-device copy from pageable memory, which waits for the GPU's queue (a synchronization per
    backward)."""
    key = (order, str(device))
    if key not in _INDEX:
        _INDEX[key] = torch.tensor(order, device=device)
    return _INDEX[key]


def permute_v_for_pv(vt: torch.Tensor) -> torch.Tensor:
    """``[..., Sk]`` (keys last, any dtype) -> ``[..., Sk16]``: Sk rounded up to 16 with zero keys,
    ``out[..., 16 i + k] = vt[..., 16 i + V_PERM16[k]]``."""
    sk = vt.shape[-1]
    sk16 = padded_keys(sk)
    raw = vt.view(torch.uint8) if vt.element_size() == 1 else vt
    if sk16 != sk:
        raw = torch.nn.functional.pad(raw, (0, sk16 - sk))
    perm = _index(V_PERM16, vt.device)
    out = raw.reshape(*raw.shape[:-1], sk16 // 16, 16)[..., perm].reshape(*raw.shape[:-1], sk16)
    return out.view(vt.dtype) if vt.element_size() == 1 else out


def unpermute_v_keys(vp: torch.Tensor, seq_k: int) -> torch.Tensor:
    """Inverse of :func:`permute_v_for_pv`: ``[..., Sk16]`` -> ``[..., seq_k]`` in key order (contiguous)."""
    sk16 = vp.shape[-1]
    raw = vp.view(torch.uint8) if vp.element_size() == 1 else vp
    inv = _index(V_UNPERM16, vp.device)
    out = raw.reshape(*raw.shape[:-1], sk16 // 16, 16)[..., inv].reshape(*raw.shape[:-1], sk16)[..., :seq_k]
    out = out.contiguous()
    return out.view(vp.dtype) if vp.element_size() == 1 else out
