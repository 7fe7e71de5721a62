"""bench/ds_fp8_numerics.py's ``shared`` variant: one E4M3 dS tile for both products, and its bound."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import ds_fp8_numerics as dsn  # noqa: E402

import fp4_attention as fa  # noqa: E402
from fp4_attention.numerics.reference import reference_backward, reference_forward  # noqa: E402


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
