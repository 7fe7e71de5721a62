"""The ``triton`` backend's declaration (the kernels are imported on first use: ``backend.py``,
``kernels.py``, the quantizers ``quant_fp8.py``, ``quant_v.py``, ``quant_nvfp4.py``)."""

from ..base import BackendSpec

SPEC = BackendSpec(
    name="triton",
    impl="fp4_attention.backends.triton.backend:TritonBackend",
    recipes=("bf16", "fp8", "nvfp4qk_fp8pv", "nvfp4qk_mxfp4pv_fast", "nvfp4qk_mxfp4pv_accurate"),
    devices=("cuda",),
    cuda_capability=((8, 9), (99, 99)),  # FP8 tensor cores (Ada, Hopper, Blackwell)
    head_dims=(64, 128),
    max_batch_heads=65535,  # its kernels and quantizers put B * Hq on a grid's y axis
    options=("block_m", "block_n", "num_warps", "num_stages"),
    qk_rotations=("hadamard",),  # rotated in the Q/K quantizer kernels (quant_fp8.py, quant_nvfp4.py)
    fused_rope=True,  # RoPE inside the FP8 and NVFP4 Q/K quantizers (triton/rope.py), else rope_rows_pair
    k_scale_keys=(1, 64),  # quant_fp8.quantize_fp8_key_groups; the kernels read the scale repeated per key
    # auto's choice for fp8 under deterministic mode (its backward has no atomics, so bitwise resume
    # holds), where cute's fp8 backward is passed over; otherwise cute's is faster (cute/__init__.py)
    priority=20,
    lse_grad=True,  # D - dlse before the kernels read D (backend.py)
    install_hint="needs a CUDA build of torch with Triton",
    summary="Triton kernels: every recipe's forward, the training recipes' backward",
)
