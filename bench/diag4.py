"""Is Hopper's BF16 wgmma accumulation exact on decoded NVFP4 operands? (dot only, vs float64)"""
import sys
import torch
import triton
import triton.language as tl
sys.path.insert(0, ".")
import fp4_attention as fa
from fp4_attention import triton_backend as tb
from tests.conftest import make_qkv, rel_l2


@triton.jit
def dot_kernel(Q, K, S, D: tl.constexpr, M: tl.constexpr, N: tl.constexpr, CHUNK: tl.constexpr):
    om = tl.arange(0, M)
    on = tl.arange(0, N)
    acc = tl.zeros([M, N], tl.float32)
    for c in tl.static_range(0, D, CHUNK):
        od = c + tl.arange(0, CHUNK)
        q = tl.load(Q + om[:, None] * D + od[None, :])
        kt = tl.load(K + on[None, :] * D + od[:, None])
        acc += tl.dot(q, kt)
    tl.store(S + om[:, None] * N + on[None, :], acc)


rec = fa.get_recipe("nvfp4qk_fp8pv")
q, k, v = make_qkv(2, 8, 2, 300, 300, 128, device="cuda")
_, _, st = tb.TritonBackend().forward(q, k, v, rec, causal=False, softmax_scale=128 ** -0.5)
qo, ko = st.q.scaled_payload().bfloat16(), st.k.scaled_payload().bfloat16()
for name, a, b in (("nvfp4 decoded", qo[0, 0, :128].contiguous(), ko[0, 0, :64].contiguous()),
                   ("bf16 normal", q[0, 0, :128].contiguous(), k[0, 0, :64].contiguous())):
    ref = a.double() @ b.double().T
    for chunk in (128, 32, 16):
        s = torch.empty(128, 64, device="cuda")
        dot_kernel[(1,)](a, b, s, D=128, M=128, N=64, CHUNK=chunk, num_warps=4)
        err = (s.double() - ref).abs()
        print(name, "chunk", chunk, "max abs err", float(err.max()), "rel", rel_l2(s, ref), "max |dot|", float(ref.abs().max()))
