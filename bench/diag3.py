"""nvfp4qk_fp8pv at GQA 4, D 128: which kernel input makes it differ from the reference?"""
import sys
import torch
import triton
sys.path.insert(0, ".")
import fp4_attention as fa
from fp4_attention import triton_backend as tb
from fp4_attention.triton_kernels import LOG2E, _fwd_kernel
from fp4_attention.reference import reference_forward
from tests.conftest import make_qkv, rel_l2

rec = fa.get_recipe("nvfp4qk_fp8pv")
d = 128
q, k, v = make_qkv(2, 8, 2, 300, 300, d, device="cuda")
out0, lse0, st = tb.TritonBackend().forward(q, k, v, rec, causal=False, softmax_scale=d ** -0.5)
rout, rlse, _ = reference_forward(q, k, v, rec, causal=False, softmax_scale=d ** -0.5, block_n=64)
print("E1 baseline", rel_l2(out0, rout))
q_op, k_op = st.q.scaled_payload().bfloat16(), st.k.scaled_payload().bfloat16()
_, _, row, col = tb._qk_kernel_operands(st.q, st.k, rec, q.shape, k.shape, (q_op, k_op))
v_op, v_scale = tb._v_kernel_operands(st.v, rec, 2, 2, d, q.device)


def run(q_op, k_op, v_op, row, col, v_scale, hq, hkv):
    out = torch.empty((2, hq, 300, d), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((2, hq, 300), dtype=torch.float32, device="cuda")
    _fwd_kernel[(triton.cdiv(300, 128), 2 * hq)](
        q_op, k_op, v_op, row, col, v_scale, out, lse,
        *q_op.stride(), *k_op.stride(), *v_op.transpose(-1, -2).stride(), *row.stride(), *col.stride(),
        *v_scale.stride(), *out.stride(), *lse.stride(), hq, hq // hkv, 300, 300, d ** -0.5 * LOG2E,
        HEAD_DIM=d, BLOCK_M=128, BLOCK_N=64, CAUSAL=False, QK_FP8=False, PV_FP8=True, LIFT=8, IMPRECISE=None,
        num_warps=8, num_stages=3)
    return out


print("E1b direct", rel_l2(run(q_op, k_op, v_op, row, col, v_scale, 8, 2), rout))
print("E2 materialized scales", rel_l2(run(q_op, k_op, v_op, row.contiguous(), col.contiguous(), v_scale.contiguous(), 8, 2), rout))
ke, ve, ce, vse = (k_op.repeat_interleave(4, 1), v_op.repeat_interleave(4, 1), col.repeat_interleave(4, 1),
                   v_scale.repeat_interleave(4, 1))
print("E3 expanded K/V (group 1)", rel_l2(run(q_op, ke, ve, row, ce, vse, 8, 8), rout))
print("E4 unit scales both", rel_l2(run(q_op, k_op, v_op, torch.ones_like(row.contiguous()) * row[0, 0, 0],
                                        col.contiguous(), v_scale, 8, 2), rout))
# emulate in torch exactly the kernel's math (fp32) with the kernel's operands
qf, kf = q_op.float(), k_op.float().repeat_interleave(4, 1)
s = (qf @ kf.transpose(-1, -2)) * row[..., None] * col.repeat_interleave(4, 1)[:, :, None, :] * (d ** -0.5 * LOG2E)
print("scores range", float(s.abs().max()), "q_op max", float(q_op.abs().max().float()))
# E5: the same operands scaled by exact powers of two into [-1.3, 1.3] (scales compensate)
print("E5 operands / 2^11", rel_l2(run(q_op / 2048, k_op / 2048, v_op, row * 2048, col * 2048, v_scale, 8, 2), rout))
# E6: emulate the kernel's scores in fp32 torch with different accumulation orders
s64 = (q_op.double() @ k_op.double().repeat_interleave(4, 1).transpose(-1, -2))
s32 = (q_op.float() @ k_op.float().repeat_interleave(4, 1).transpose(-1, -2))
sbf = torch.matmul(q_op, k_op.repeat_interleave(4, 1).transpose(-1, -2)).float()  # cuBLAS BF16 GEMM, fp32 acc
print("E6 fp32 vs fp64 dot rel", rel_l2(s32, s64), "cuBLAS bf16 vs fp64", rel_l2(sbf, s64),
      "max abs", float((sbf.double() - s64).abs().max()), "dot max", float(s64.abs().max()))
