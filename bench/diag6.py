"""Byte comparison of the Triton NVFP4 quantizer with the reference at attention sizes."""
import sys
import torch
sys.path.insert(0, ".")
from fp4_attention.quant import nvfp4_global_scale, quantize_nvfp4
from fp4_attention.triton_quant import quantize_nvfp4_rows
from tests.conftest import make_qkv

for shape in [(2, 2, 300), (2, 8, 300), (8, 2, 300), (2, 8, 4096)]:
    q, _, _ = make_qkv(shape[0], shape[1], 1, shape[2], 8, 128, device="cuda")
    g = nvfp4_global_scale(q, dims=(2, 3))
    got, dec = quantize_nvfp4_rows(q, g)
    ref = quantize_nvfp4(q, g)
    bp = (got.payload != ref.payload)
    bs = (got.block_scale != ref.block_scale)
    print(shape, "payload mismatches", int(bp.sum()), "scale mismatches", int(bs.sum()),
          "first rows", bp.any(-1).nonzero()[:3].tolist(), "dec==ref", torch.equal(dec.float(), ref.scaled_payload()))
    for t in bs.nonzero()[:3].tolist():
        blk = q[tuple(t[:-1])][t[-1] * 16:(t[-1] + 1) * 16].float()
        print("   ", t, "amax_b", float(blk.abs().amax()), "g", float(g[t[0], t[1], 0, 0]), "got", int(got.block_scale[tuple(t)]),
              "ref", int(ref.block_scale[tuple(t)]))
