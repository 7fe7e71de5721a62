"""Forward-kernel configurations: correctness vs the reference and speed (one call on the GPU)."""
import sys
import torch
import triton
sys.path.insert(0, ".")
import fp4_attention as fa
from fp4_attention import triton_backend as tb
from fp4_attention.reference import reference_forward
from tests.conftest import make_qkv, rel_l2

be = tb.TritonBackend()
configs = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3)]
for recipe in ("nvfp4qk_fp8pv", "fp8", "bf16"):
    rec = fa.get_recipe(recipe)
    q, k, v = make_qkv(2, 8, 2, 300, 300, 128, device="cuda")
    for bm, bn, nw, ns in configs:
        try:
            out, lse, _ = be.forward(q, k, v, rec, causal=False, softmax_scale=128 ** -0.5, block_m=bm, block_n=bn,
                                     num_warps=nw, num_stages=ns)
            rout, rlse, _ = reference_forward(q, k, v, rec, causal=False, softmax_scale=128 ** -0.5, block_n=bn)
            err = rel_l2(out, rout)
            lerr = float((lse - rlse).abs().max())
        except Exception as e:  # noqa: BLE001
            print(recipe, (bm, bn, nw, ns), "FAILED", str(e)[:200])
            continue
        times = []
        for B, H, HK, S, causal in [(4, 32, 8, 4096, True), (2, 32, 32, 8192, False)]:
            qq, kk, vv = make_qkv(B, H, HK, S, S, 128, seed=2, device="cuda")
            ms = triton.testing.do_bench(lambda: be.forward(qq, kk, vv, rec, causal=causal, softmax_scale=128 ** -0.5,
                                                            block_m=bm, block_n=bn, num_warps=nw, num_stages=ns),
                                         warmup=30, rep=100, return_mode="median")
            times.append(f"{4 * B * H * S * S * 128 / (2 if causal else 1) / ms / 1e9:.0f}")
        print(f"{recipe:14s} bm{bm} bn{bn} w{nw} s{ns}: err {err:.2e} lse {lerr:.1e} TFLOP/s(incl quant) {times}", flush=True)
