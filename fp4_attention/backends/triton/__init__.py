"""The ``triton`` backend's declaration (the kernels are imported on first use: ``backend.py``,
``kernels.py``, ``quant.py``)."""

from ..base import BackendSpec

SPEC = BackendSpec(
    name="triton",
    impl="fp4_attention.backends.triton.backend:TritonBackend",
    recipes=("bf16", "fp8", "nvfp4qk_fp8pv", "nvfp4qk_mxfp4pv_fast", "nvfp4qk_mxfp4pv_accurate"),
    devices=("cuda",),
    cuda_capability=((8, 9), (99, 99)),  # FP8 tensor cores (Ada, Hopper, Blackwell)
    head_dims=(64, 128),
    options=("block_m", "block_n", "num_warps", "num_stages"),
    qk_rotations=("hadamard",),  # rotated in the Q/K quantizer kernels (quant.py)
    # fp8 forward+backward, B4 H32/8 S4096 causal on the H200: 10.18 ms, cute 5.56 ms
    # (results/cute_prep_h200/attention_bench_cute_h200.md). auto still prefers this backend: its
    # backward is deterministic (no atomics), which bitwise resume in deterministic mode needs; the
    # cute backward accumulates dQ (and GQA dK/dV) with FP32 atomics.
    priority=20,
    install_hint="needs a CUDA build of torch with Triton",
    summary="Triton kernels: every recipe's forward, the training recipes' backward",
)
