"""The CuTe backward's K/V operands (``triton.bwd_kv``) without a GPU, interpreted
(``TRITON_INTERPRET=1``, in a subprocess: the variable is read when the kernels are defined).

Checks against torch: ``kb`` is ``BF16(k8 * col2)`` (the token scale in the dQ operand; either
BF16 rounding: ``tests/interp_rounding.py``; NaN and the extreme codes included); exact bytes:
``v8`` is ``pv_layout.unpermute_v_keys(vt, Sk).transpose(-1, -2)`` for lengths that are and are
not multiples of 16 or of the kernel's block, head dims 64 and 128, and GQA shapes; ``col``
is the K token scales (the saved tensor itself) and ``col2 = col * 2^-8``.
"""

from __future__ import annotations


def _interpreted_checks() -> list[str]:
    import torch

    from fp4_attention.backends.pv_layout import permute_v_for_pv, unpermute_v_keys
    from fp4_attention.backends.triton.bwd_kv import backward_kv_operands
    from fp4_attention.numerics.quant import FP8Tensor
    from tests.interp_rounding import bf16_either_rounding

    failed = []
    g = torch.Generator().manual_seed(0)
    for b, h, sk, d in ((1, 2, 100, 64), (2, 1, 130, 128), (1, 1, 64, 64), (1, 3, 7, 128)):
        case = f"B{b} H{h} S{sk} D{d}"
        k8 = torch.randint(0, 256, (b, h, sk, d), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
        v = torch.randint(0, 256, (b, h, sk, d), generator=g, dtype=torch.uint8)
        vt = permute_v_for_pv(v.transpose(-1, -2).contiguous()).contiguous().view(torch.float8_e4m3fn)
        ks = torch.rand(b, h, sk, 1, generator=g) + 0.5
        ks[0, 0, 1] = float("nan")  # a K row holding a NaN: its scale travels as NaN
        kv = backward_kv_operands(FP8Tensor(data=k8, scale=ks), vt, col2_scale=2.0**-8)
        kb, v8 = kv["kb"], kv["v8"]
        if kv["col"].data_ptr() != ks.data_ptr() or tuple(kv["col"].shape) != (b, h, sk):
            failed.append(f"{case}: col is not the saved token scales")
        want2 = ks.view(b, h, sk) * 2.0**-8
        if not (
            torch.equal(kv["col2"].isnan(), want2.isnan())
            and torch.equal(kv["col2"].nan_to_num(), want2.nan_to_num())
        ):
            failed.append(f"{case}: col2")
        if not bf16_either_rounding(kb, k8.float() * want2.unsqueeze(-1)):
            failed.append(f"{case}: kb")
        want = unpermute_v_keys(vt, sk).transpose(-1, -2).contiguous().view(torch.uint8)
        if not (torch.equal(v8.view(torch.uint8), want) and torch.equal(want, v)):
            failed.append(f"{case}: v8")
    try:
        k_s = FP8Tensor(data=k8, scale=torch.ones(*k8.shape[:-1], 1))
        backward_kv_operands(k_s, vt[..., :-16] if vt.shape[-1] > 16 else vt[:, :, :1], col2_scale=2.0**-8)
        failed.append("a vt of the wrong length did not raise")
    except ValueError:
        pass
    return failed


def test_interpreted_kv_operands():
    from ..conftest import run_interpreted  # not at the top: this file also runs as a script

    run_interpreted(__file__)


if __name__ == "__main__":
    bad = _interpreted_checks()
    print("\n".join(bad) if bad else "ok")
