"""``bench/quant_bench.py --kinds amax`` without a GPU: its launches of V's amax kernel and of the
per-head amax kernel (every entry of V_AMAX_LAUNCHES and HEAD_AMAX_LAUNCHES, rows past the end
included) run interpreted (``TRITON_INTERPRET=1``, in a subprocess) and give, on finite inputs, the
amax of the first launch of their kind, which equals torch's (with a NaN, the flag). Its ``rope``
rows likewise: every call runs, and the fused quantizers' bytes equal the unfused paths'; and its
``nvfp4_blocks`` and ``pair_blocks`` rows: every launch's bytes equal the default's. The timing
itself needs the GPU.
"""

from __future__ import annotations

import pytest

PARTS = ("amax", "rope", "nvfp4_blocks", "pair_blocks")  # one interpreted process each (CI's balance)


def _interpreted_checks(part: str) -> list[str]:
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import quant_bench as qb

    failed = []
    seen = []

    def rec(kind, shape, rows, warps, fn, n_bytes, bw, same):
        fn()  # the timed call once more: the accumulators must stay as they were
        seen.append((kind, rows, warps))
        return {"quantizer": kind, "rows": rows, "bytes_equal_default": same}

    qb._rec = rec
    g = torch.Generator().manual_seed(0)
    if part == "amax":
        return _amax_checks(qb, g, seen)
    q = (torch.randn(1, 4, 40, qb.D, generator=g) * 2).bfloat16()
    if part == "rope":
        # the rope kind's calls, small: every launch of ROPE_SWEEP and the NVFP4 heads, bytes checked
        k = torch.randn(1, 2, 40, qb.D, generator=g).bfloat16()
        for r in qb._rope_records(q, k, 1.0):
            if not r["bytes_equal_default"]:
                failed.append(f"rope: {r['quantizer']} at {r['rows']}: bytes differ from the unfused path's")
        if len(seen) != len(qb.ROPE_SWEEP) + 2 + 3 + 1:
            failed.append(f"rope: {len(seen)} calls run: {seen}")
    elif part == "nvfp4_blocks":
        # every launch of NVFP4_BLOCKS_SWEEP, bytes equal to the default's
        xb = (torch.randn(2, 2, 70, 32, generator=g) * 3).bfloat16()
        for r in qb._nvfp4_blocks_records(xb, "cpu", 1.0):
            if not r["bytes_equal_default"]:
                failed.append(f"nvfp4_blocks: {r['quantizer']} at {r['rows']}: bytes differ from the default")
        if len(seen) != len(qb.NVFP4_BLOCKS_SWEEP) + 1:
            failed.append(f"nvfp4_blocks: {len(seen)} calls run: {seen}")
    elif part == "pair_blocks":
        kb = torch.randn(1, 2, 45, qb.D, generator=g).bfloat16()
        for r in qb._pair_blocks_records(q, kb, 1.0):
            if not r["bytes_equal_default"]:
                failed.append(f"pair_blocks: {r['quantizer']} at {r['rows']}: bytes differ from the default")
        if len(seen) != len(qb.PAIR_BLOCKS_SWEEP):
            failed.append(f"pair_blocks: {len(seen)} calls run: {seen}")
    else:
        failed.append(f"unknown part {part!r}; one of {', '.join(PARTS)}")
    return failed


def _amax_checks(qb, g, seen) -> list[str]:
    import torch

    failed = []
    x = (torch.randn(2, 3, 130, 32, generator=g) * 4).bfloat16()
    # finite, as the bench's inputs are: a flagged head's amax leaves out its flagged block, which
    # depends on the launch (the amax of a flagged head is not used)
    records = qb._amax_records(x, "cpu", 1.0)
    for r in records:
        if not r["bytes_equal_default"]:
            failed.append(f"{r['quantizer']} at {r['rows']}: amax or flags differ from the first launch's")
    kinds = {k for k, _, _ in seen}
    if kinds != {"V amax pass alone", "head amax pass alone"}:
        failed.append(f"kinds run: {sorted(kinds)}")
    if len(seen) != len(qb.V_AMAX_LAUNCHES) + len(qb.HEAD_AMAX_LAUNCHES):
        failed.append(f"{len(seen)} launches run")
    # the first launch of each kind against torch
    from fp4_attention.backends.triton import quant_common

    x[1, 2, 100, 7] = float("nan")  # flags head (1, 2)
    amax, bad = quant_common.zeroed_amax_and_flag((6,), x.device)
    rows, warps = qb.HEAD_AMAX_LAUNCHES[0]
    quant_common._head_amax_kernel[(-(-130 // rows), 6)](
        x, amax, bad, 3, 130, *x.stride()[:3], D=32, BLOCK_S=rows
    )
    want = x.float().abs().amax(dim=(2, 3)).flatten()
    if not (bad.tolist() == [0, 0, 0, 0, 0, 1] and torch.equal(amax[:5], want[:5])):
        failed.append(f"head amax {amax.tolist()} {bad.tolist()}, want {want.tolist()}")
    return failed


@pytest.mark.parametrize("part", PARTS)
def test_interpreted_launches(part):
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__, part)


if __name__ == "__main__":
    import sys

    bad = _interpreted_checks(sys.argv[1])
    print("\n".join(bad) if bad else "ok")
