"""``numerics.ds_fp8``: the CuTe backward's ``ds_fp8`` option's definition (one E4M3 dS tile for dQ
and dK) and its per-head scale from the bound, on the reference backward (CPU)."""

import pytest
import torch

import fp4_attention as fa
from fp4_attention.backends.dout import quantize_dout
from fp4_attention.numerics.ds_fp8 import bound_scale, shared_tile_round
from fp4_attention.numerics.reference import reference_backward, reference_forward

from ..conftest import make_qkv


def _case(b=1, hq=4, hkv=2, s=192, d=64, seed=3, outliers=False):
    q, k, v = make_qkv(b, hq, hkv, s, s, d, seed=seed)
    if outliers:  # a few x100 channels, as tools/fidelity.py's outlier family
        for t in (q, k, v):
            t.view(-1)[::997] *= 100
    rec = fa.get_recipe("fp8")
    sm = d**-0.5
    out, lse, st = reference_forward(q, k, v, rec, causal=True, softmax_scale=sm)
    state = type(st)(q=st.q, k=st.k, v=st.v, out=out, lse=lse)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(seed + 1)).bfloat16()
    return rec, state, dout, sm


def _bound_inputs(state, dout):
    v_scale = state.v.scale.squeeze(2).contiguous()
    do_q, _, delta = quantize_dout(dout, state.out, v_scale)
    do_norm = (do_q.data.float() * do_q.scale).norm(dim=-1)
    row, col = state.q.scale.squeeze(-1), state.k.scale.squeeze(-1)
    return row, do_norm, delta[..., : row.shape[-1]], state.v.data.float().norm(dim=-1), col


def _tiles(rec, state, dout, sm, rnd):
    """Every (product, j0) -> the tile T = operand * row (dQ) or * col (dK) that ``rnd`` rounded."""
    row = state.q.scale.squeeze(-1)
    col = state.k.scale.squeeze(-1)
    hkv = col.shape[1]
    r = row.unflatten(1, (hkv, -1)).unsqueeze(-1)
    c_all = col.unsqueeze(2).unsqueeze(-2)
    tiles = {}

    def spy(t, product, j0):
        y = rnd(t, product, j0)
        c = c_all[..., j0 : j0 + t.shape[-1]]
        tiles[(product, j0)] = (y * r if product == "dq" else y * c, t * r if product == "dq" else t * c)
        return y

    reference_backward(state, dout, rec, causal=True, softmax_scale=sm, ds_round=spy, token_scales="ds")
    return tiles


@pytest.mark.parametrize("outliers", [False, True])
def test_bound_scale_never_saturates_and_one_tile_feeds_both(outliers):
    """With the bound's scale no value of dS row col / s exceeds 448 (the bound holds), and the dQ and
    dK operands are the same E4M3 tile T times the same s: T row = T' col for every tile."""
    rec, state, dout, sm = _case(outliers=outliers)
    s = bound_scale(*_bound_inputs(state, dout))
    assert s.shape == (1, 4) and bool((s > 0).all())
    assert torch.equal(s, torch.exp2(torch.log2(s).round()))  # powers of two
    tiles = _tiles(
        rec, state, dout, sm, shared_tile_round(state.q.scale.squeeze(-1), state.k.scale.squeeze(-1), s)
    )
    sc = s.unflatten(1, (2, -1))[..., None, None]
    for j0 in {j for _, j in tiles}:
        (tq, xq), (tk, _) = tiles[("dq", j0)], tiles[("dk", j0)]
        torch.testing.assert_close(tq, tk, rtol=2e-6, atol=0)
        assert bool((xq.abs() / sc <= 448).all()), j0
        codes = (tq / sc).to(torch.float8_e4m3fn).float()
        # on the E4M3 grid (to the FP32 rounding of dividing by row, then multiplying back)
        torch.testing.assert_close(codes, tq / sc, rtol=4e-7, atol=0)


def test_shared_tile_saturates_at_448_with_a_small_scale():
    """A scale 2^10 below the bound's: the largest values saturate at 448 s, not inf or NaN."""
    rec, state, dout, sm = _case()
    s = bound_scale(*_bound_inputs(state, dout)) * 2.0**-10
    tiles = _tiles(
        rec, state, dout, sm, shared_tile_round(state.q.scale.squeeze(-1), state.k.scale.squeeze(-1), s)
    )
    sc = s.unflatten(1, (2, -1))[..., None, None]
    top = max(float((t / sc).abs().max()) for (p, _), (t, _) in tiles.items() if p == "dq")
    assert abs(top - 448.0) <= 448.0 * 4e-7


def test_bound_scale_shapes_and_degenerate_heads():
    row = torch.ones(1, 4, 8)
    col = torch.ones(1, 2, 8)
    z = torch.zeros(1, 4, 8)
    assert torch.equal(bound_scale(row, z, z, torch.zeros(1, 2, 8), col), torch.ones(1, 4))  # all-zero: 1
    vn = torch.full((1, 2, 8), 448.0)
    nrm = torch.ones(1, 4, 8)
    nrm[0, 1, 3] = float("nan")  # a NaN row is ignored
    s = bound_scale(row, nrm, z, vn, col)
    assert torch.equal(s, torch.ones(1, 4))  # 1 * 448 / 448
    with pytest.raises(ValueError, match="multiple of Hkv"):
        bound_scale(torch.ones(1, 3, 8), torch.ones(1, 3, 8), torch.ones(1, 3, 8), vn, col)
