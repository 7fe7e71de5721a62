"""nvfp4qk_fp8pv kernel vs reference across batch/head counts and pipeline depths."""
import sys
import torch
sys.path.insert(0, ".")
import fp4_attention as fa
from fp4_attention import triton_backend as tb
from fp4_attention.reference import reference_forward
from tests.conftest import make_qkv, rel_l2

rec = fa.get_recipe("nvfp4qk_fp8pv")
be = tb.TritonBackend()
for (b, hq, hkv, s, seed) in [(2, 2, 2, 300, 0), (8, 2, 2, 300, 0), (2, 8, 2, 300, 0), (2, 8, 2, 300, 1), (1, 1, 1, 300, 0),
                              (1, 1, 1, 300, 5), (1, 8, 8, 64, 0)]:
    q, k, v = make_qkv(b, hq, hkv, s, s, 128, seed=seed, device="cuda")
    rout, rlse, _ = reference_forward(q, k, v, rec, causal=False, softmax_scale=128 ** -0.5, block_n=64)
    res = []
    for nw, ns in ((8, 3), (4, 1), (8, 1)):
        out, lse, st = be.forward(q, k, v, rec, causal=False, softmax_scale=128 ** -0.5, num_warps=nw, num_stages=ns)
        res.append(f"w{nw}s{ns}:{rel_l2(out, rout):.1e}")
    gq = st.q.global_scale.flatten()[:4].tolist()
    print((b, hq, hkv, s, seed), res, "g_q", [f"{x:.2e}" for x in gq], "q amax", float(q.abs().amax()))
