"""Localize nvfp4qk_fp8pv kernel-vs-reference differences (GQA 4, D 128)."""
import sys
import torch
sys.path.insert(0, ".")
import fp4_attention as fa
from fp4_attention import triton_backend as tb
from fp4_attention.reference import reference_forward
from fp4_attention.quant import nvfp4_global_scale
from fp4_attention.triton_quant import quantize_nvfp4_rows
from tests.conftest import make_qkv, rel_l2
from tests.test_reference import naive_ste

be = tb.TritonBackend()
for recipe in ("nvfp4qk_fp8pv", "fp8"):
    rec = fa.get_recipe(recipe)
    for group, d in ((1, 128), (4, 128), (4, 64)):
        q, k, v = make_qkv(2, 2 * group, 2, 300, 300, d, device="cuda")
        if recipe == "nvfp4qk_fp8pv":
            qs, qd = quantize_nvfp4_rows(q.contiguous(), nvfp4_global_scale(q, dims=(2, 3)))
            print("decode equal", torch.equal(qd.float(), qs.scaled_payload()))
        out, lse, st = be.forward(q, k, v, rec, causal=False, softmax_scale=d ** -0.5)
        rout, rlse, _ = reference_forward(q, k, v, rec, causal=False, softmax_scale=d ** -0.5, block_n=tb.default_block_n(d))
        ste = naive_ste(q, k, v, recipe, False, None)[0]
        per_head = [round(rel_l2(out[:, h], rout[:, h]), 4) for h in range(out.shape[1])]
        print(recipe, group, d, "kern-ref", round(rel_l2(out, rout), 5), "kern-ste", round(rel_l2(out, ste), 5),
              "ref-ste", round(rel_l2(rout, ste), 5), "per head", per_head,
              "lse per head", [round(float((lse[:, h] - rlse[:, h]).abs().max()), 5) for h in range(out.shape[1])])
