"""The attention alone at the training shape, for the attention share of a training step.

A separate process (before the training runs, so that they start on an empty GPU) times the
attention alone at the training shape, ``[4096, mb, 32 | 8, 128]`` (``sbhd``, as the megatron-core
adapter calls it), causal, BF16 inputs, each recipe on the backend its runs use
(``fp4_attention.attention(..., backend=...)``, quantization included), forward and forward +
backward, medians of ``triton.testing.do_bench``; share = L x (forward + backward) / median step.
The same process times cuDNN BF16 attention through torch SDPA (``[mb, H, S, D]``, as
``bench/attention_bench.py``): what the baseline arm would gain or lose with cuDNN (on the H200 the
``fa4`` backend of the default ``bf16`` arm is the faster).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from . import REPO
from .process import failure_reason, log_tail, run_process

HQ, HKV, HEAD_DIM = 32, 8, 128
# the benchmark's entry point: with --attention-timing-json it runs time_attention (the child process)
ENTRY_POINT = REPO / "bench" / "train_throughput.py"


def time_attention(
    recipes: list[str],
    micro_batches: list[int],
    *,
    seq: int,
    warmup_ms: int = 50,
    rep_ms: int = 250,
    backend: str | Mapping[str, str] = "triton",
    device: str = "cuda",
    heads: tuple[int, int, int] = (HQ, HKV, HEAD_DIM),
    timer=None,
) -> list[dict]:
    """Attention alone at the training shape (see the module docstring): each recipe through
    ``fp4_attention.attention(..., layout="sbhd", backend=...)`` and cuDNN BF16 through torch SDPA.

    Args:
        backend: one backend for every recipe, or recipe -> backend.
        heads: (query heads, key/value heads, head dim); inputs are BF16 ``[seq, mb, H, D]`` N(0, 1).
        timer: ``timer(fn, grads) -> ms`` (default: median of ``triton.testing.do_bench``, CUDA events,
            ``grads`` set to None before every call).
    Returns:
        One record per (impl, micro_batch): ``impl`` (a recipe, or ``cudnn_bf16_sdpa``), ``backend``,
        ``fwd_ms`` and ``fwd_bwd_ms`` (ms per layer), or ``error`` (the case could not run; the others
        still do).
    Raises:
        KeyError: a recipe missing from a ``backend`` mapping.
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fp4_attention as fa

    if timer is None:
        import triton

        def timer(fn, grads):
            return float(
                triton.testing.do_bench(
                    fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grads, return_mode="median"
                )
            )

    def fwd_and_fwd_bwd(fn, inputs, grad_out) -> dict:
        with torch.no_grad():
            fwd = timer(lambda: fn(*inputs), None)
        leaves = [t.detach().requires_grad_() for t in inputs]
        return {"fwd_ms": fwd, "fwd_bwd_ms": timer(lambda: fn(*leaves).backward(grad_out), leaves)}

    def cudnn(a, b, c):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)

    backends = {r: backend[r] if isinstance(backend, Mapping) else backend for r in recipes}
    hq, hkv, d = heads
    out = []
    torch.manual_seed(0)
    for mb in micro_batches:
        q = torch.randn(seq, mb, hq, d, device=device, dtype=torch.bfloat16)
        k, v = (torch.randn(seq, mb, hkv, d, device=device, dtype=torch.bfloat16) for _ in range(2))
        dout = torch.randn_like(q)
        cases = {
            r: (
                lambda a, b, c, r=r: fa.attention(
                    a, b, c, recipe=r, causal=True, layout="sbhd", backend=backends[r]
                ),
                (q, k, v),
                dout,
            )
            for r in recipes
        }
        bhsd = tuple(t.permute(1, 2, 0, 3).contiguous() for t in (q, k, v))
        cases["cudnn_bf16_sdpa"] = (cudnn, bhsd, dout.permute(1, 2, 0, 3).contiguous())
        for impl, (fn, inputs, grad_out) in cases.items():
            rec = {
                "impl": impl,
                "backend": backends.get(impl, "cudnn"),
                "micro_batch": mb,
                "seq_length": seq,
                "heads": f"{hq}/{hkv}",
                "head_dim": d,
                "layout": "bhsd" if impl == "cudnn_bf16_sdpa" else "sbhd",
            }
            try:
                rec.update(fwd_and_fwd_bwd(fn, inputs, grad_out))
            except Exception as err:  # noqa: BLE001 - reported in the output, the other cases go on
                rec["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            out.append(rec)
            print(json.dumps(rec), flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    return out


def run_attention_timing(args, recipes: Mapping[str, str]) -> tuple[list[dict], str | None]:
    """Time the attention of ``recipes`` (recipe -> backend) in a child process (this one never holds
    a CUDA context); (records, error)."""
    import torch

    if not torch.cuda.is_available():
        return [], "skipped: no CUDA device"
    out = Path(args.run_dir) / "attention_timing.json"
    out.unlink(missing_ok=True)
    argv = [
        sys.executable,
        str(ENTRY_POINT),
        "--attention-timing-json",
        str(out),
        "--seq",
        str(args.seq),
        "--micro-batches",
        *map(str, args.micro_batches),
        "--attention-recipes",
        *(f"{r}={b}" for r, b in recipes.items()),
    ]
    print(f"attention timing: {shlex.join(argv)}", flush=True)
    log = Path(args.run_dir) / "attention_timing.log"
    res = run_process(argv, log_path=log, timeout_s=args.attention_timeout, poll_memory=False)
    print(f"attention timing: exit {res['exit_code']} in {res['wall_s']:.0f} s", flush=True)
    if res["exit_code"] != 0 or not out.exists():
        tail = log_tail(log, 15)
        reason = failure_reason(res["exit_code"], res["timed_out"], tail, args.attention_timeout)
        return [], f"failed ({reason}): {tail}"
    return json.loads(out.read_text()), None
