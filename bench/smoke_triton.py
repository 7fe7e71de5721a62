"""Quick GPU smoke: Triton backend vs reference at a few shapes, plus one timing per recipe."""
import sys, time, torch, triton
sys.path.insert(0, ".")
import fp4_attention as fa
from fp4_attention import triton_backend as tb
from fp4_attention.reference import reference_forward, reference_backward
from tests.conftest import make_qkv, rel_l2
be = tb.TritonBackend()
for recipe in fa.TRAINING_RECIPES:
    rec = fa.get_recipe(recipe)
    for causal in (False, True):
        for (sq, sk, d) in [(300, 300, 128), (129, 257, 64)]:
            q, k, v = make_qkv(2, 8, 2, sq, sk, d, seed=1, device="cuda")
            try:
                o, lse, st = be.forward(q, k, v, rec, causal=causal, softmax_scale=d ** -0.5)
                ro, rlse, rst = reference_forward(q, k, v, rec, causal=causal, softmax_scale=d ** -0.5)
                fin = torch.isfinite(rlse)
                do = torch.randn(o.shape, device="cuda").bfloat16()
                g = be.backward(st, do, rec, causal=causal, softmax_scale=d ** -0.5)
                rg = reference_backward(rst, do, rec, causal=causal, softmax_scale=d ** -0.5)
                print(f"{recipe:14s} causal={causal} {sq}x{sk} d{d}: out {rel_l2(o, ro):.2e} lse {float((lse[fin]-rlse[fin]).abs().max()):.1e} "
                      f"dq {rel_l2(g[0], rg[0]):.2e} dk {rel_l2(g[1], rg[1]):.2e} dv {rel_l2(g[2], rg[2]):.2e}", flush=True)
            except Exception as e:
                print(f"{recipe} causal={causal} {sq}x{sk} d{d}: FAILED {type(e).__name__}: {str(e)[:600]}", flush=True)
for recipe in fa.TRAINING_RECIPES:
    rec = fa.get_recipe(recipe)
    for B, H, HK, S, causal in [(4, 32, 8, 4096, True), (2, 32, 32, 8192, False)]:
        q, k, v = make_qkv(B, H, HK, S, S, 128, seed=2, device="cuda")
        try:
            fn = lambda: be.forward(q, k, v, rec, causal=causal, softmax_scale=128 ** -0.5)
            ms = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
            flops = 4 * B * H * S * S * 128 / (2 if causal else 1)
            o, lse, st = fn()
            do = torch.randn(o.shape, device="cuda").bfloat16()
            msb = triton.testing.do_bench(lambda: be.backward(st, do, rec, causal=causal, softmax_scale=128 ** -0.5), warmup=50, rep=200, return_mode="median")
            print(f"TIME {recipe:14s} B{B} H{H}/{HK} S{S} causal={causal}: fwd {ms:.3f} ms {flops/ms/1e9:.0f} TFLOP/s (incl. quantize); bwd {msb:.3f} ms {2.5*flops/msb/1e9:.0f} TFLOP/s", flush=True)
        except Exception as e:
            print(f"TIME {recipe} FAILED {type(e).__name__}: {str(e)[:400]}", flush=True)
