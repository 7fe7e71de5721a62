"""Diagnostics for mismatches between the Triton backend and the reference (kept for debugging)."""
import sys
import torch
sys.path.insert(0, ".")
import fp4_attention as fa
from fp4_attention import triton_backend as tb
from fp4_attention.quant import nvfp4_global_scale, quantize_fp8, quantize_nvfp4
from fp4_attention.triton_quant import quantize_fp8_rows, quantize_nvfp4_rows
from fp4_attention.reference import reference_forward, reference_backward
from tests.conftest import make_qkv, rel_l2
from tests.gpu.test_triton_quant import _inputs

for d in (64, 128):
    x = _inputs(d)
    for fmt in ("e4m3", "e5m2"):
        a, b = quantize_fp8_rows(x, fmt), quantize_fp8(x, fmt, dims=(-1,))
        bad = a.data.view(torch.uint8) != b.data.view(torch.uint8)
        print("fp8", d, fmt, "mismatch", int(bad.sum()), "scale eq", bool(torch.equal(a.scale, b.scale)))
        if bad.any():
            i = bad.nonzero()[:5]
            for t in i.tolist():
                print("   ", t, float(x[tuple(t)]), float(b.scale[tuple(t[:-1])]), int(a.data.view(torch.uint8)[tuple(t)]), int(b.data.view(torch.uint8)[tuple(t)]))
    g = nvfp4_global_scale(x, dims=(2, 3))
    got, dec = quantize_nvfp4_rows(x, g)
    ref = quantize_nvfp4(x, g)
    bp = got.payload != ref.payload
    bs = got.block_scale != ref.block_scale
    print("nvfp4", d, "payload mismatch", int(bp.sum()), "scale mismatch", int(bs.sum()))
    for t in bs.nonzero()[:5].tolist():
        blk = x[tuple(t[:-1])][t[-1] * 16:(t[-1] + 1) * 16].float()
        gg = g[t[0], t[1], 0, 0]
        sr = (blk.abs().amax() / 6.0) / gg
        print("   scale", t, float(sr), int(got.block_scale[tuple(t)]), int(ref.block_scale[tuple(t)]))
    for t in bp.nonzero()[:5].tolist():
        j = t[-1] * 2
        print("   payload", t, x[tuple(t[:-1])][j:j + 2].float().tolist(), int(got.payload[tuple(t)]), int(ref.payload[tuple(t)]))

be = tb.TritonBackend()
for recipe, group, d, causal in [("fp8", 1, 64, False), ("fp8", 4, 128, True), ("nvfp4qk_fp8pv", 4, 128, True), ("bf16", 4, 128, True)]:
    rec = fa.get_recipe(recipe)
    q, k, v = make_qkv(2, 2 * group, 2, 300, 300, d, device="cuda")
    out, lse, st = be.forward(q, k, v, rec, causal=causal, softmax_scale=d ** -0.5)
    rout, rlse, rst = reference_forward(q, k, v, rec, causal=causal, softmax_scale=d ** -0.5, block_n=tb.default_block_n(d))
    fin = torch.isfinite(rlse)
    dout = torch.randn(out.shape, device="cuda").bfloat16()
    g1 = be.backward(st, dout, rec, causal=causal, softmax_scale=d ** -0.5)
    g2 = reference_backward(rst, dout, rec, causal=causal, softmax_scale=d ** -0.5)
    print(recipe, group, d, causal, "out", rel_l2(out, rout), "lse", float((lse[fin] - rlse[fin]).abs().max()),
          "dq dk dv", [round(rel_l2(a, b), 5) for a, b in zip(g1, g2)])
