"""Host side of the Triton forward (runs on the CPU): ``triton_backend.forward_operands`` turns the
quantized Q/K/V the backend saves into the kernel's operands, for every recipe family."""

import pytest
import torch

import fp4_attention as fa
from fp4_attention.backends.triton import backend as tb
from fp4_attention.numerics.operands import quantize_qk, quantize_v
from fp4_attention.numerics.quant import FP8Tensor
from tests.conftest import make_qkv


def _saved(recipe, q, k, v):
    """Quantized Q/K/V as the backend's state holds them (V8 transposed to [B, Hkv, D, Sk])."""
    q_s, k_s = quantize_qk(q, k, recipe)
    v_s = quantize_v(v, recipe)
    if recipe.pv == "fp8":
        v_s = FP8Tensor(data=v_s.data.transpose(-1, -2).contiguous(), scale=v_s.scale)
    return q_s, k_s, v_s


@pytest.mark.parametrize("name", ["bf16", "fp8", "nvfp4qk_fp8pv", "nvfp4qk_mxfp4pv_fast"])
def test_forward_operands(name):
    rec = fa.get_recipe(name)
    q, k, v = make_qkv(2, 4, 2, 40, 40, 64, seed=3)
    q_s, k_s, v_s = _saved(rec, q, k, v)
    # NVFP4 Q/K: the decoded pair as the forward has it (without it the Triton decode runs: on a GPU,
    # or interpreted in test_triton_nvfp4_quant_cpu.py, which checks that path's operands)
    decoded = (
        (q_s.scaled_payload().bfloat16(), k_s.scaled_payload().bfloat16()) if rec.qk == "nvfp4" else None
    )
    q_op, k_op, v_op, row, col, v_scale = tb.forward_operands(q_s, k_s, v_s, rec, q.shape, k.shape, decoded)
    assert row.shape == (2, 4, 40) and col.shape == (2, 2, 40) and v_scale.shape == (2, 2, 64)
    assert v_op.shape[:2] == (2, 2) and v_op.shape[-1] == 64
    if name == "bf16":
        assert q_op is q_s and torch.equal(v_op, v) and (row == 1).all() and (v_scale == 1).all()
    elif name == "fp8":
        assert torch.equal(q_op.view(torch.uint8), q_s.data.view(torch.uint8))
        assert torch.equal(row, q_s.scale.squeeze(-1)) and torch.equal(col, k_s.scale.squeeze(-1))
        assert torch.equal(v_op.float(), quantize_v(v, rec).data.float())  # [B, Hkv, Sk, D] view
        assert torch.equal(v_scale, v_s.scale.squeeze(2))
    else:  # NVFP4 Q/K: the decoded pair passed through, global scales as row/col
        assert q_op is decoded[0] and k_op is decoded[1]
        assert torch.equal(row, q_s.global_scale.squeeze(-1).expand(2, 4, 40))
        if rec.direct_p is not None:  # alpha_V * q_V in BF16, unit channel scales
            assert v_op.dtype == torch.bfloat16 and (v_scale == 1).all()


def test_the_quantizers_refuse_tensors_beyond_32_bit_offsets():
    """A strided view's span (its storage's reach), not its numel, decides (meta tensors: no memory)."""
    from fp4_attention.backends.triton.quant_common import check_int32_span

    fits = torch.empty((4, 32, 4096, 128), device="meta")  # Llama-8B shapes: 2^26 elements
    check_int32_span("t", fits)
    # a [B, H, S, D] view with a long step between tokens: small numel, large span
    view = torch.empty(0, device="meta").as_strided((1, 32, 200_000, 128), (0, 128, 3 * 32 * 128 * 3, 1))
    assert view.numel() < 2**31
    with pytest.raises(ValueError, match=r"spans \d+ elements, beyond the kernels' 32-bit offsets"):
        check_int32_span("quantize_fp8_rows", view)
