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
    options=("tiles",),
    # fp8 fwd+bwd B4 H32/8 S4096 causal on the H200: 4.855 ms, triton 9.827
    # (results/cute_unpromoted_h200/attention_bench_qk_h200.md); nvfp4qk_fp8pv: its CuTe backward
    # (the qk_bf16 S^T) has not been timed against triton's yet, so auto keeps triton for it
    priority=25,
    recipe_priority=(("nvfp4qk_fp8pv", 15),),
    nondeterministic=("fp8", "nvfp4qk_fp8pv"),  # dQ (and GQA dK/dV) by FP32 atomics
    install_hint="pip install 'fp4-attention-pretrain[cute]' (nvidia-cutlass-dsl, flash-attn-4)",
    summary=(
        "CuTe DSL fp8 and nvfp4qk_fp8pv forward and backward for sm_90; "
        "dQ by FP32 atomics: not bitwise reproducible"
    ),
)
