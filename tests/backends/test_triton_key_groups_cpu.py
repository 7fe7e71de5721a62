"""The Triton K quantizer with one scale per 64 keys (``quant.quantize_fp8_key_groups``, recipe option
``k_scale_keys``) without a GPU, interpreted (``TRITON_INTERPRET=1``, in a subprocess: the variable
is read when the kernels are defined).

* The scales equal ``numerics.quant.quantize_fp8_key_groups``'s exactly (the group's scale repeated
  per key; NaN for a group holding a NaN or an Inf, 1 for an all-zero group), at sequence lengths
  that are and are not a multiple of 64, with the codes of a non-finite group all 0x7F.
* The codes are the per-token kernel's where they must be: a group whose keys all have the same
  amax has the per-token scale, and then the same bytes as ``_fp8_rows_kernel`` (they share the
  conversion, ``_fp8_codes``). Against ``numerics.quant`` the codes need the hardware's FP8
  conversion: test_triton_quant.py on the GPU.
* Read in place from ``[B, S, H, D]`` memory: the contiguous call's bytes; with a rotation's signs:
  the bytes of the kernel fed the reference's FP32 rotation.
"""

from __future__ import annotations


def _interpreted_checks() -> list[str]:
    import torch

    from fp4_attention.backends.triton.quant_fp8 import quantize_fp8_key_groups, quantize_fp8_rows
    from fp4_attention.numerics import quant as nq
    from fp4_attention.numerics.rotation import hadamard_signs, rotate

    failed = []
    g = torch.Generator().manual_seed(0)
    for seq in (128, 150):
        k = torch.randn(2, 3, seq, 64, generator=g) * torch.exp(torch.randn(2, 3, seq, 1, generator=g) * 2)
        k[0, 0, :64] = 0.0  # an all-zero group
        k[0, 1, 70, 3] = float("nan")  # poisons keys 64..127 of head (0, 1)
        k[1, 2, seq - 1, 0] = float("inf")  # the last (possibly short) group
        k = k.bfloat16()
        got = quantize_fp8_key_groups(k, 64)
        want = nq.quantize_fp8_key_groups(k, 64)
        same_nan = torch.equal(got.scale.isnan(), want.scale.isnan())
        if not (same_nan and torch.equal(got.scale.nan_to_num(), want.scale.nan_to_num())):
            failed.append(f"scales S={seq}")
        codes = got.data.view(torch.uint8)
        bad = want.scale.isnan().expand_as(codes)
        if not bool((codes[bad] == 0x7F).all()) or not bool(bad[0, 1, 64:128].all()):
            failed.append(f"codes of non-finite groups S={seq}")
        # read in place from [B, S, H, D] memory
        strided = k.transpose(1, 2).contiguous().transpose(1, 2)
        again = quantize_fp8_key_groups(strided, 64)
        if not torch.equal(again.data.view(torch.uint8), codes) or not torch.equal(
            again.scale.nan_to_num(), got.scale.nan_to_num()
        ):
            failed.append(f"read in place S={seq}")

    # every key of a group with the same amax (the same largest element): the per-token scale
    k = torch.randn(1, 2, 128, 64, generator=g).clamp(-3, 3)
    k[..., 5] = 7.0
    k = k.bfloat16()
    grouped, rows = quantize_fp8_key_groups(k, 64), quantize_fp8_rows(k)
    if not torch.equal(grouped.scale, rows.scale) or not torch.equal(
        grouped.data.view(torch.uint8), rows.data.view(torch.uint8)
    ):
        failed.append("codes against the per-token kernel")

    # the rotation in the kernel: the bytes of the kernel fed the reference's FP32 rotation
    k = (torch.randn(1, 2, 100, 64, generator=g) * 3).bfloat16()
    s = hadamard_signs(5, 64)
    a = quantize_fp8_key_groups(k, 64, signs=s)
    b = quantize_fp8_key_groups(rotate(k, s).contiguous(), 64)
    if not torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)) or not torch.equal(
        a.scale, b.scale
    ):
        failed.append("rotation")

    for bad_call in (lambda: quantize_fp8_key_groups(k, 48), lambda: quantize_fp8_key_groups(k[0], 64)):
        try:
            bad_call()
            failed.append("no ValueError for a bad call")
        except ValueError:
            pass
    return failed


def test_interpreted_key_group_quantizer_matches_the_definition():
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__)


if __name__ == "__main__":
    import sys

    problems = _interpreted_checks()
    print("\n".join(problems) if problems else "ok")
    sys.exit(1 if problems else 0)
