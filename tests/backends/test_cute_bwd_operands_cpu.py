"""The CuTe fp8 backward's operands (``cute.backend.backward_operands``) without a GPU: its Triton
kernels interpreted (``TRITON_INTERPRET=1``, in a subprocess), the result checked against the
torch expressions: ``qb``/``kb`` = BF16(q8 * row) / BF16(k8 * col2) (the token scales times
2^-LIFT in the dK/dQ operands, ``reference_backward``'s fp8; either BF16 rounding here,
``tests/interp_rounding.py``), ``v8`` = V in key order (``unpermute_v(...).transpose(-1, -2)``), each
with the shape, dtype and layout the kernel's arguments take; dO^T is the ``V_PERM16`` transpose of
the row-major codes. Causal GQA and MHA shapes, lengths that are not multiples of the tiles.
The ``nvfp4qk_fp8pv`` state (NVFP4 Q/K) likewise: ``qb``/``kb`` (and ``q8``/``k8``, which its
``qk_bf16`` kernel takes in their place) are ``scaled_payload()`` in BF16, NaN for a poisoned block,
and the per-query/per-key vectors are the per-head global scales broadcast per token.
"""

from __future__ import annotations

import pytest


def _interpreted_checks() -> list[str]:
    import torch

    from fp4_attention.backends.cute import backend as cb
    from fp4_attention.backends.cute.fwd_sm90 import LIFT
    from fp4_attention.backends.dout import LOG2E, quantize_dout
    from fp4_attention.backends.pv_layout import permute_v_for_pv
    from fp4_attention.numerics.operands import SavedState
    from fp4_attention.numerics.quant import nvfp4_global_scale, quantize_fp8, quantize_nvfp4
    from tests.dispatch_ops import FILL_OPS, OpNames
    from tests.interp_rounding import bf16_either_rounding

    failed = []
    g = torch.Generator().manual_seed(0)
    # B > 1: the batch offsets; GQA at S 130: 192 padded query rows, 256 padded keys
    shapes = ((1, 4, 1, 100, 64), (1, 2, 2, 130, 128), (2, 4, 2, 70, 64), (1, 4, 2, 130, 64))
    cases = [(qk, *shape) for qk in ("fp8", "nvfp4") for shape in shapes]
    for qk, b, hq, hkv, s, d in cases:
        case = f"{qk} B{b} H{hq}/{hkv} S{s} D{d}"
        q, k, v, do, o = (torch.randn(b, h, s, d, generator=g).bfloat16() for h in (hq, hkv, hkv, hq, hq))
        if qk == "fp8":
            q_s, k_s = quantize_fp8(q, "e4m3", (-1,)), quantize_fp8(k, "e4m3", (-1,))
            q_s.data.view(torch.uint8)[0, 0, 3, :2] = torch.tensor(
                [0x7F, 0xFF], dtype=torch.uint8
            )  # NaN codes
            q_img, k_img = q_s.data.to(torch.bfloat16), k_s.data.to(torch.bfloat16)
            q_sc, k_sc = q_s.scale.squeeze(-1), k_s.scale.squeeze(-1)
        else:
            q_s, k_s = (quantize_nvfp4(t, nvfp4_global_scale(t, dims=(2, 3))) for t in (q, k))
            q_s.block_scale[0, 0, 3, 1] = 0x7F  # a poisoned block: NaN for its 16 elements
            k_s.block_scale[0, -1, 5, 0] = 0x7F
            q_img, k_img = q_s.scaled_payload().bfloat16(), k_s.scaled_payload().bfloat16()
            q_sc = q_s.global_scale.reshape(b, hq, 1).expand(b, hq, s)
            k_sc = k_s.global_scale.reshape(b, hkv, 1).expand(b, hkv, s)
        v_q = quantize_fp8(v, "e4m3", (-2,), pow2=True)
        v_s = type(v_q)(data=permute_v_for_pv(v_q.data.transpose(-1, -2).contiguous()), scale=v_q.scale)
        state = SavedState(q=q_s, k=k_s, v=v_s, out=o, lse=torch.randn(b, hq, s, generator=g))
        with OpNames() as names:
            ops = cb.backward_operands(state, do, d**-0.5)  # the scale of `sm` below
        # one fill for the FP32 accumulators and dO's amax and flag (five on a GPU before)
        fills = [op for op in names.names if op in FILL_OPS]
        if fills != ["zeros"]:
            failed.append(f"{case}: fills {fills}")
        # dO's scale and codes from the amax pass that starts from those words
        _, ref_s, _ = quantize_dout(do, o, state.v.scale.squeeze(2))
        if not torch.equal(ops["s_do"], ref_s):
            failed.append(f"{case}: dO scale")
        # no copy (the NVFP4 per-head scales are read through stride-0 views or written per token
        # by the K/V kernel) and no torch arithmetic (col2 = col * 2^-LIFT comes from that kernel);
        # copy_ itself is left out: the Triton interpreter moves every kernel argument with it
        copies = [op for op in names.names if op in ("clone", "_to_copy", "mul")]
        if copies:
            failed.append(f"{case}: torch ops {copies}")
        tile_m, tile_n = cb.BWD_TILES
        accs = {"dq_accum": (b, hq, -(-s // tile_m) * tile_m * d)}
        if hq != hkv:
            accs.update(dk=(b, hkv, -(-s // tile_n) * tile_n * d), dv=(b, hkv, -(-s // tile_n) * tile_n * d))
        spans = []
        for name, shape in accs.items():
            t = ops[name]
            if tuple(t.shape) != shape or t.dtype != torch.float32 or not t.is_contiguous():
                failed.append(f"{case}: {name} is {t.dtype} {tuple(t.shape)} {t.stride()}, want {shape}")
            elif not bool((t == 0).all()):
                failed.append(f"{case}: {name} not zeroed")
            spans.append((t.data_ptr(), t.data_ptr() + 4 * t.numel()))
        spans.sort()
        if any(a[1] > b_[0] for a, b_ in zip(spans, spans[1:])):
            failed.append(f"{case}: accumulators overlap {spans}")
        want = dict(v8=cb.unpermute_v(v_s, s).data.transpose(-1, -2).contiguous())
        if qk == "nvfp4":  # the exact decodes, also the qk_bf16 kernel's S^T operands
            want.update(qb=q_img, kb=k_img, q8=q_img, k8=k_img)
        else:  # the token scales in the BF16 operands: FP32 exact values of the BF16 outputs
            want.update(
                qb=q_img.float() * (q_sc * 2.0**-LIFT).unsqueeze(-1),
                kb=k_img.float() * (k_sc * 2.0**-LIFT).unsqueeze(-1),
            )
        sm = d**-0.5
        vecs = dict(
            r=(q_sc * (sm * LOG2E), ops["r"]),
            row=(q_sc * 2.0**-LIFT, ops["row"]),
            col=(k_sc, ops["col"]),
            col2=(k_sc * 2.0**-LIFT, ops["col2"]),
        )
        for name, (ref, got) in vecs.items():  # col, col2 exact; r, row one FP32 product each
            same = (
                torch.equal(got[..., :s], ref)
                if name.startswith("col")
                else torch.allclose(got[..., :s], ref, rtol=1e-6, atol=0)
            )
            if not same:
                failed.append(f"{case}: {name}")
        for name, ref in want.items():
            got = ops[name]
            rounded = ref.dtype == torch.float32  # a BF16 output given by its exact FP32 values
            dtype = torch.bfloat16 if rounded else ref.dtype
            if (got.shape, got.dtype, got.stride()) != (ref.shape, dtype, ref.stride()):
                failed.append(f"{case}: {name} is {got.dtype} {tuple(got.shape)} {got.stride()}")
            elif rounded:
                if not bf16_either_rounding(got, ref):
                    failed.append(f"{case}: {name} values")
            elif ref.dtype == torch.bfloat16:
                if not (
                    torch.equal(got.isnan(), ref.isnan())
                    and torch.equal(got.nan_to_num(0), ref.nan_to_num(0))
                ):
                    failed.append(f"{case}: {name} values")
            elif not torch.equal(got.view(torch.uint8), ref.view(torch.uint8)):
                failed.append(f"{case}: {name} bytes")
        dot = permute_v_for_pv(ops["do8"].transpose(-1, -2).contiguous())
        if not torch.equal(dot.view(torch.uint8), ops["dot8"].view(torch.uint8)):
            failed.append(f"{case}: dO^T")
        failed += _postprocess_checks(case, cb, ops, state, sm)
    return failed


def _postprocess_checks(case, cb, ops, state, sm) -> list[str]:
    """``postprocess_gradients`` on these operands: the gradients from accumulators
    filled with random values (the dO amax words after them kept), each value at the offset
    ``test_bwd_post_cpu.unit_offset`` gives, dQ times the softmax scale."""
    import torch

    from tests.backends.test_bwd_post_cpu import unit_offset
    from tests.interp_rounding import bf16_either_rounding

    b, hq, s, d = state.out.shape
    n = sum(ops[name].numel() for name in ("dq_accum", "dk", "dv") if ops[name].dtype == torch.float32)
    ops["acc"][:n] = torch.randn(n, generator=torch.Generator().manual_seed(3))
    got = cb.postprocess_gradients(ops, state, sm)
    failed = []
    for name, blk, acc, t, scale in (
        ("dq", 64, ops["dq_accum"], got[0], sm),
        ("dk", 128, ops["dk"], got[1], 1.0),
        ("dv", 128, ops["dv"], got[2], 1.0),
    ):
        if acc.dtype != torch.float32:  # MHA: the kernel's own BF16 dK/dV, returned as they are
            if t is not acc:
                failed.append(f"{case}: {name} is not the kernel's tensor")
            continue
        kind = "dq" if name == "dq" else "dk"
        off = torch.tensor(
            [[(r // blk) * blk * d + unit_offset(kind, d, r % blk, c) for c in range(d)] for r in range(s)]
        )
        want = acc.reshape(acc.shape[0], acc.shape[1], -1)[:, :, off.reshape(-1)].reshape(t.shape) * scale
        if name == "dq" and t.stride() != state.out.stride():  # the caller's layout
            failed.append(f"{case}: dq strides {t.stride()}")
        if not bf16_either_rounding(t, want):
            failed.append(f"{case}: postprocess {name}")
    return failed


def test_interpreted_backward_operands():
    from ..conftest import have_module, run_interpreted  # not at the top: this file also runs as a script

    if not have_module("cutlass"):
        pytest.skip("needs nvidia-cutlass-dsl (the cute extra)")
    run_interpreted(__file__)


if __name__ == "__main__":
    bad = _interpreted_checks()
    print("\n".join(bad) if bad else "ok")
