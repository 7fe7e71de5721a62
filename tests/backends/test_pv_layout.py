"""pv_layout: the key permutation of the cute backend's E4M3 V operand, on the CPU."""

import pytest
import torch

from fp4_attention.backends.pv_layout import V_PERM16, V_UNPERM16, permute_v_for_pv, unpermute_v_keys


def test_v_perm16_is_the_accumulator_to_a_fragment_map():
    # wgmma accumulator: thread q of a quad holds columns 2q, 2q+1, 8+2q, 9+2q of each 16; the 8-bit
    # register A fragment wants k = 4q..4q+3 from it (PTX ISA, wgmma .m64nNk32 fragments)
    assert sorted(V_PERM16) == list(range(16))
    for q in range(4):
        assert V_PERM16[4 * q : 4 * q + 4] == (2 * q, 2 * q + 1, 8 + 2 * q, 9 + 2 * q)
    assert all(V_PERM16[V_UNPERM16[j]] == j for j in range(16))


@pytest.mark.parametrize("sk", [1, 15, 16, 33, 256])
def test_permute_roundtrip_and_padding(sk):
    x = torch.randint(0, 255, (2, 3, 8, sk), dtype=torch.uint8)
    p = permute_v_for_pv(x)
    assert p.shape[-1] == -(-sk // 16) * 16
    assert torch.equal(unpermute_v_keys(p, sk), x)
    # slot k of each 16 holds key V_PERM16[k]; padding keys are zero
    full = torch.nn.functional.pad(x, (0, p.shape[-1] - sk))
    for k in range(16):
        assert torch.equal(p[..., k::16], full[..., V_PERM16[k] :: 16])


def test_fp8_dtype_kept():
    x = torch.randn(1, 1, 4, 20).to(torch.float8_e4m3fn)
    p = permute_v_for_pv(x)
    assert p.dtype == torch.float8_e4m3fn
    assert torch.equal(unpermute_v_keys(p, 20).view(torch.uint8), x.view(torch.uint8))


def test_the_key_permutation_is_built_once_per_device(monkeypatch):
    """No host-to-device copy per call (one from pageable memory waits for the GPU's queue)."""
    import fp4_attention.backends.pv_layout as pv

    made = []
    real = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: made.append(a) or real(*a, **k))
    monkeypatch.setattr(pv, "_INDEX", {})
    vt = torch.randint(0, 255, (1, 2, 8, 40), dtype=torch.uint8)
    for _ in range(3):
        assert torch.equal(pv.unpermute_v_keys(pv.permute_v_for_pv(vt), 40), vt)
    assert len(made) == 2, made  # V_PERM16 and V_UNPERM16, once each
