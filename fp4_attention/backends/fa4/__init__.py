"""The ``fa4`` backend's declaration (flash-attn-4 is imported on first use: ``backend.py``)."""

from ..base import BackendSpec

SPEC = BackendSpec(
    name="fa4",
    impl="fp4_attention.backends.fa4.backend:FA4Backend",
    recipes=("bf16",),
    devices=("cuda",),
    cuda_capability=((9, 0), (10, 3)),  # FA4's CuTe kernels: Hopper and Blackwell
    head_dims=(64, 128),
    # bf16 forward+backward, B4 H32/8 S4096 causal on the H200: 3.84 ms, the fastest BF16 kernel
    # measured (cuDNN 4.20 ms, FA2 7.21 ms; results/cute/attention_bench_cute_h200.md)
    priority=30,
    install_hint="pip install 'fp4-attention-pretrain[cute]' (flash-attn-4)",
    summary="flash-attn-4's BF16 forward and backward (the strongest BF16 control)",
)
