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
    priority=10,  # fwd+bwd faster than triton's, but not deterministic (triton/__init__.py)
    install_hint="pip install 'fp4-attention-pretrain[cute]' (nvidia-cutlass-dsl, flash-attn-4)",
    summary=(
        "CuTe DSL fp8 forward and backward, nvfp4qk_fp8pv forward (Triton backward) for sm_90; "
        "dQ by FP32 atomics: not bitwise reproducible"
    ),
)
