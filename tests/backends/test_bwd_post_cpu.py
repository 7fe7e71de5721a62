"""The CuTe backward's accumulator conversion (``triton.bwd_post``) without a GPU.

- The accumulator layout the module documents (``unit_offset`` here, written from the wgmma
  fragment and the 128-bit register-to-shared copies) equals the one CuTe's layout algebra gives
  for the backward kernel's own tiled MMAs and copies (``FP8BackwardSm90._get_tiled_mma``,
  ``r2s_tiled_copy_dQaccum`` / ``sdQaccum_layout`` for dQ, FA4's ``epilogue_dKV`` copy for GQA's dK
  and dV), element by element, at head dims 64 and 128: traced on the CPU (needs the CUTLASS DSL).
- The Triton kernel, interpreted (``TRITON_INTERPRET=1``, in a subprocess), writes
  ``BF16(acc[unit_offset] * scale)`` (either BF16 rounding: ``tests/interp_rounding.py``) into
  gradients of any strides, for MHA (dQ only) and GQA, lengths that are not multiples of the
  blocks, and refuses malformed arguments. The GPU test (``test_cute_backend.py``) compares it with
  FA4's postprocess bit for bit.
"""

from __future__ import annotations

import importlib.util

import pytest


def _have(name: str) -> bool:  # conftest.have_module, here so that this file also runs as a script
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def unit_offset(kind: str, d: int, row: int, col: int) -> int:
    """Offset in a gradient's accumulator block (64 rows for dQ, 128 for dK/dV) of its ``(row,
    col)``: thread ``t = 32 w + 4 r + q`` of warpgroup ``g`` holds, in register ``4 n + 2 i + j``,
    row ``16 w + 8 i + r`` and column ``8 n + 2 q + j`` of its part; the copy puts register ``k`` at
    ``(k // 4) * 512 + 4 t + k % 4`` of the warpgroup's run. dQ: warpgroup ``g`` holds the columns
    ``[g D/2, (g+1) D/2)``; dK/dV: the rows ``[64 g, 64 g + 64)``, all columns."""
    if kind == "dq":
        g, r, c = col // (d // 2), row, col % (d // 2)
        base = g * 32 * d
    else:
        g, r, c = row // 64, row % 64, col
        base = g * 64 * d
    w, i, lr = r // 16, (r // 8) % 2, r % 8
    n, q, j = c // 8, (c // 2) % 4, c % 2
    t = 32 * w + 4 * lr + q
    k = 4 * n + 2 * i + j
    return base + (k // 4) * 512 + 4 * t + k % 4


@pytest.mark.skipif(
    not (_have("cutlass") and _have("flash_attn")), reason="needs the CUTLASS DSL and flash-attn-4"
)
def test_offsets_match_cute_layout_algebra():
    import cutlass
    from cutlass import Float32, cute

    from fp4_attention.backends.cute.bwd_sm90 import FP8BackwardSm90

    maps = {}

    def trace(d: int):
        @cute.jit
        def probe():
            kern = FP8BackwardSm90(d, 4, True)
            mmas = kern._get_tiled_mma()
            kern.num_threads_per_warp_group = 128  # set by __call__ before _setup_attributes
            kern._setup_attributes()
            nwg = kern.num_wg_mma
            # FA4's epilogue_dKV (GQA): this copy into (tile_n * D / nwg, nwg) FP32, then bulk adds
            dkv_copy = cute.make_tiled_copy_tv(
                cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Float32, num_bits_per_copy=128),
                cute.make_layout((128, nwg)),
                cute.make_layout(4),
            )
            cases = (
                ("dq", mmas[4], kern.tile_m, kern.r2s_tiled_copy_dQaccum, kern.sdQaccum_layout),
                ("dk", mmas[2], kern.tile_n, dkv_copy, cute.make_layout((kern.tile_n * d // nwg, nwg))),
                ("dv", mmas[3], kern.tile_n, dkv_copy, cute.make_layout((kern.tile_n * d // nwg, nwg))),
            )
            for kind, mma, rows, copy, smem in cases:
                got = {}
                coords = cute.make_identity_tensor((rows, d))
                slots = cute.make_identity_tensor(smem.shape)
                for t in cutlass.range_constexpr(mma.size):
                    tc = mma.get_slice(t).partition_C(coords)
                    ts = copy.get_slice(t).partition_D(slots)
                    # the kernels copy the accumulator's registers in order onto the copy's slots
                    for i in cutlass.range_constexpr(cute.size(tc)):
                        e, g = ts[i]
                        got[tuple(tc[i])] = e + smem.shape[0] * g
                maps[(kind, d, rows)] = got

        probe()

    for d in (64, 128):
        trace(d)
    for (kind, d, rows), got in maps.items():
        assert len(got) == rows * d, (kind, d)
        bad = [(rc, off) for rc, off in got.items() if unit_offset(kind, d, *rc) != off]
        assert not bad, f"{kind} D{d}: {len(bad)} offsets differ, e.g. {bad[:4]}"


def _interpreted_checks() -> list[str]:
    import torch

    from fp4_attention.backends.triton.bwd_post import convert_accumulators
    from tests.interp_rounding import bf16_either_rounding

    failed = []
    g = torch.Generator().manual_seed(0)

    def blocks(kind, d, rows_pad):
        """offset of each (row, col) of a [rows_pad, D] accumulator run"""
        blk = 64 if kind == "dq" else 128
        off = torch.empty(rows_pad, d, dtype=torch.long)
        for r in range(rows_pad):
            for c in range(d):
                off[r, c] = (r // blk) * blk * d + unit_offset(kind, d, r % blk, c)
        return off

    def want(acc_run, off, s, scale):  # acc_run [B, H, rows_pad * D] -> FP32 [B, H, s, D]
        b_h = acc_run.shape[:2]
        vals = acc_run.reshape(*b_h, -1)[:, :, off.reshape(-1)].reshape(*b_h, *off.shape)
        return vals[:, :, :s] * scale

    for b, hq, hkv, sq, sk, d, layout in (
        (1, 2, 2, 100, 100, 64, "bhsd"),  # MHA: dQ only
        (2, 4, 1, 64, 130, 128, "bshd"),  # GQA 4, Sk past a 128-key block
        (1, 6, 2, 7, 200, 64, "bshd"),  # GQA 3, one short query block
        (1, 4, 2, 130, 64, 128, "sbhd"),
    ):
        case = f"B{b} H{hq}/{hkv} Sq{sq} Sk{sk} D{d} {layout}"
        gqa = hq != hkv
        q_rows, kv_rows = -(-sq // 64) * 64, -(-sk // 128) * 128
        n_q, n_kv = b * hq * q_rows * d, (b * hkv * kv_rows * d if gqa else 0)
        acc = torch.randn(n_q + 2 * n_kv + 7, generator=g) * 3.0

        def grad(h, s):
            shape = {"bhsd": (b, h, s, d), "bshd": (b, s, h, d), "sbhd": (s, b, h, d)}[layout]
            perm = {"bhsd": (0, 1, 2, 3), "bshd": (0, 2, 1, 3), "sbhd": (1, 2, 0, 3)}[layout]
            return torch.full(shape, float("nan"), dtype=torch.bfloat16).permute(*perm)

        dq = grad(hq, sq)
        dk, dv = (grad(hkv, sk), grad(hkv, sk)) if gqa else (None, None)
        convert_accumulators(acc, dq, dk, dv, softmax_scale=0.125, q_rows=q_rows, kv_rows=kv_rows)
        ok = bf16_either_rounding(dq, want(acc[:n_q].view(b, hq, -1), blocks("dq", d, q_rows), sq, 0.125))
        if not ok:
            failed.append(f"{case}: dq")
        if gqa:
            off = blocks("dk", d, kv_rows)
            runs = (("dk", dk, acc[n_q : n_q + n_kv]), ("dv", dv, acc[n_q + n_kv : n_q + 2 * n_kv]))
            for name, t, run in runs:
                if not bf16_either_rounding(t, want(run.view(b, hkv, -1), off, sk, 1.0)):
                    failed.append(f"{case}: {name}")
    dq = torch.empty(1, 2, 64, 128, dtype=torch.bfloat16)
    bad_calls = (  # (what, acc values, dq, dk, q_rows, kv_rows)
        ("acc too small", 10, dq, None, 64, 0),
        ("q_rows not covering Sq", 2 * 32 * 128, dq, None, 32, 0),
        ("head dim 96", 2 * 64 * 96, torch.empty(1, 2, 64, 96, dtype=torch.bfloat16), None, 64, 0),
        ("dk without dv", 4 * 64 * 128, dq, dq, 64, 64),
        ("FP16 dq", 2 * 64 * 128, dq.half(), None, 64, 0),
    )
    for what, n, dq_, dk_, q_rows, kv_rows in bad_calls:
        call = lambda: convert_accumulators(  # noqa: E731
            torch.zeros(n), dq_, dk_, None, softmax_scale=1.0, q_rows=q_rows, kv_rows=kv_rows
        )
        try:
            call()
            failed.append(f"{what}: did not raise")
        except ValueError:
            pass
    return failed


def test_interpreted_convert_accumulators():
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__)


if __name__ == "__main__":
    bad = _interpreted_checks()
    print("\n".join(bad) if bad else "ok")
