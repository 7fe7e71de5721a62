"""The ``cute`` backend's declaration (the CuTe DSL kernel is imported on first use:
``backend.py``, ``fwd_sm90.py``, ``bwd_sm90.py``)."""

from ..base import BackendSpec

SPEC = BackendSpec(
    name="cute",
    impl="fp4_attention.backends.cute.backend:CuteBackend",
    recipes=("fp8", "nvfp4qk_fp8pv"),
    devices=("cuda",),
    cuda_capability=((9, 0), (9, 0)),  # wgmma / TMA kernels for Hopper
    head_dims=(64, 128),
    max_batch_heads=65535,  # its Triton quantizers and dO preparation put B * Hq on a grid's y axis
    options=("tiles",),
    fused_rope=True,  # RoPE inside the FP8 and NVFP4 Q/K quantizers (triton/rope.py), else rope_rows_pair
    k_scale_keys=(1, 64),  # 64: the forward folds each group's scale into its row factor (k_group)
    # fwd+bwd on the H200 (2026-12-02, 19f036c, results/cute_nvfp4_bwd_h200), cute (forward tiles
    # 128x128) vs triton: fp8 4.262 vs 10.841 ms at B4 H32/8 S4096 causal, 2.420 vs 3.034 at B1,
    # 12.908 vs 35.930 at B2 H32/32 S8192; nvfp4qk_fp8pv 4.580 vs 11.133, 2.732 vs 3.123, 14.292 vs
    # 36.384
    priority=25,
    lse_grad=True,  # D - dlse before the kernels read D (backend.py)
    nondeterministic=("fp8", "nvfp4qk_fp8pv"),  # dQ (and GQA dK/dV) by FP32 atomics
    install_hint="pip install 'fp4-attention-pretrain[cute]' (nvidia-cutlass-dsl, flash-attn-4)",
    summary=(
        "CuTe DSL fp8 and nvfp4qk_fp8pv forward and backward for sm_90; "
        "dQ by FP32 atomics: not bitwise reproducible"
    ),
)
