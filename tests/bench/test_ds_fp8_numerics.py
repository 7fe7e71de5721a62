"""bench/ds_fp8_numerics.py's ``shared`` variants: one E4M3 dS tile for both products, its bound, and the
per-head scale and rounding of the deleted CuTe ``ds_fp8`` option (``bound_scale``, ``shared_tile_round``)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import ds_fp8_numerics as dsn  # noqa: E402

import fp4_attention as fa  # noqa: E402
from fp4_attention.backends.dout import quantize_dout  # noqa: E402
from fp4_attention.numerics.reference import reference_backward, reference_forward  # noqa: E402

from ..conftest import make_qkv  # noqa: E402


def _case(family: str):
    rec = fa.get_recipe("fp8")
    q, k, v, dout, _, _ = dsn.float64_case(family, 1, 4, 2, 192, 64, 7)
    sm = 64**-0.5
    out, lse, st = reference_forward(q, k, v, rec, causal=True, softmax_scale=sm)
    state = type(st)(q=st.q, k=st.k, v=st.v, out=out, lse=lse)
    return rec, state, dout, sm


def _captured(rec, state, dout, sm, rnd):
    seen = []

    def spy(t, product, j0):
        seen.append((t.clone(), product, j0))
        return rnd(t, product, j0)

    reference_backward(state, dout, rec, causal=True, softmax_scale=sm, ds_round=spy, token_scales="ds")
    return seen


def test_shared_tile_bound_covers_every_block():
    """The static scale's bound is at least each block's true amax of |dS row col| (no saturation),
    on Gaussian and outlier inputs; a bound below it would clamp values to 448."""
    for family in ("normal", "outliers"):
        rec, state, dout, sm = _case(family)
        rnd = dsn.shared_round(state, dout, rec, sm)
        seen = _captured(rec, state, dout, sm, rnd)
        assert {p for _, p, _ in seen} == {"dq", "dk"}
        for t, product, j0 in seen:
            bn = t.shape[-1]
            x = t * rnd.row if product == "dq" else t * rnd.col[..., j0 : j0 + bn]
            amax = x.abs().amax(dim=(-2, -1))  # [B, Hkv, G]
            bound = rnd.bound[..., j0 : j0 + bn].amax(-1)
            assert torch.all(amax <= bound * (1 + 1e-5)), (family, product, j0)


def test_shared_tile_is_one_tile_for_both_products():
    """dQ's operand times row and dK's times col are the same E4M3 tile T (to FP32 rounding of the
    two products dS*col*row and dS*row*col); the oracle scale gives each block an amax of T
    between 224 and 448 (the power of two at or above amax / 448)."""
    rec, state, dout, sm = _case("normal")
    for scale in ("bound", "block-amax", "head-amax", "head-bound"):
        rnd = dsn.shared_round(state, dout, rec, sm, scale=scale)
        seen = _captured(rec, state, dout, sm, rnd)
        by_block = {}
        for t, product, j0 in seen:
            bn = t.shape[-1]
            c = rnd.col[..., j0 : j0 + bn]
            tile = rnd(t, product, j0) * (rnd.row if product == "dq" else c)
            by_block.setdefault(j0, {})[product] = (tile, t * rnd.row if product == "dq" else t * c)
        assert by_block
        for j0, prods in by_block.items():
            (tq, xq), (tk, _) = prods["dq"], prods["dk"]
            torch.testing.assert_close(tq, tk, rtol=2e-6, atol=0)
            if scale == "block-amax":
                amax = xq.abs().amax(dim=(-2, -1))
                nz = amax > 0
                sc = dsn.pow2_ceil(amax[nz] / 448.0)
                ratio = amax[nz] / sc
                assert torch.all((ratio > 224) & (ratio <= 448)), j0


# the per-head shared tile (bound_scale, shared_tile_round), on the reference backward


def _ref_case(b=1, hq=4, hkv=2, s=192, d=64, seed=3, outliers=False):
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
    rec, state, dout, sm = _ref_case(outliers=outliers)
    s = dsn.bound_scale(*_bound_inputs(state, dout))
    assert s.shape == (1, 4) and bool((s > 0).all())
    assert torch.equal(s, torch.exp2(torch.log2(s).round()))  # powers of two
    tiles = _tiles(
        rec, state, dout, sm, dsn.shared_tile_round(state.q.scale.squeeze(-1), state.k.scale.squeeze(-1), s)
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
    rec, state, dout, sm = _ref_case()
    s = dsn.bound_scale(*_bound_inputs(state, dout)) * 2.0**-10
    tiles = _tiles(
        rec, state, dout, sm, dsn.shared_tile_round(state.q.scale.squeeze(-1), state.k.scale.squeeze(-1), s)
    )
    sc = s.unflatten(1, (2, -1))[..., None, None]
    top = max(float((t / sc).abs().max()) for (p, _), (t, _) in tiles.items() if p == "dq")
    assert abs(top - 448.0) <= 448.0 * 4e-7


def test_bound_scale_shapes_and_degenerate_heads():
    row = torch.ones(1, 4, 8)
    col = torch.ones(1, 2, 8)
    z = torch.zeros(1, 4, 8)
    assert torch.equal(dsn.bound_scale(row, z, z, torch.zeros(1, 2, 8), col), torch.ones(1, 4))  # all-zero: 1
    vn = torch.full((1, 2, 8), 448.0)
    nrm = torch.ones(1, 4, 8)
    nrm[0, 1, 3] = float("nan")  # a NaN row is ignored
    s = dsn.bound_scale(row, nrm, z, vn, col)
    assert torch.equal(s, torch.ones(1, 4))  # 1 * 448 / 448
    with pytest.raises(ValueError, match="multiple of Hkv"):
        dsn.bound_scale(torch.ones(1, 3, 8), torch.ones(1, 3, 8), torch.ones(1, 3, 8), vn, col)
