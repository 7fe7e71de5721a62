"""The cute fp8 backward against FA4 BF16's, in ms, at B4 H32/8 S4096 causal and B2 H32/32 S8192:
``attention_bench.cute_bwd_direct`` (``backend.backward_fp8`` on one forward's state: the operand
preparation, the kernel and the postprocess, without autograd),
FA4's backward called the same way (``attention_bench.fa4_bwd_direct``: its preprocess, kernel and
postprocess; the like-for-like baseline) and FA4's backward through autograd (which also adds the
gradients into ``.grad``, as the ``bwd`` rows of ``attention_bench`` do for both; the only FA4
baseline of the runs in ``results/cute_bwd_schedule_h200/`` and ``results/cute_bwd_price_h200/``).
One JSON line per shape on stdout. For same-run A/Bs of trees (``bench/variants.sh``), run from a
tree's root (the ``bench`` of the working directory is imported):

    bash bench/variants.sh run 'python3 <checkout>/bench/bwd_time.py > "$VOUT/t.jsonl"'
"""

import json
import sys

import torch

sys.path.insert(0, "bench")
from attention_bench import D, bench, cute_bwd_direct, fa4_bwd_direct, ours_fn  # noqa: E402

rows = []
for b, hq, hkv, s, causal in ((4, 32, 8, 4096, True), (2, 32, 32, 8192, False)):
    torch.manual_seed(0)
    q = torch.randn(b, hq, s, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, s, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cute_ms = bench(cute_bwd_direct("fp8", q, k, v, causal))
    fa4_ms = bench(ours_fn("bf16", q, k, v, causal, "bwd", backend="fa4"))
    fa4_direct_ms = bench(fa4_bwd_direct(q, k, v, causal))
    rows.append(
        {
            "B": b,
            "Hq": hq,
            "Hkv": hkv,
            "S": s,
            "causal": causal,
            "cute_fp8_bwd_direct_ms": cute_ms,
            "fa4_bf16_bwd_ms": fa4_ms,
            "fa4_bf16_bwd_direct_ms": fa4_direct_ms,
        }
    )
    print(json.dumps(rows[-1]), flush=True)
