"""Which CUDA graph breaks which eager step: the experiment that narrows down the illegal memory
access of ``attention_bench.py --graphed --rounds N`` (N > 1; ``results/session_2026-12-05e_h100``,
``results/session_2026-12-05f_cpu``). It found the cause (``results/session_2026-12-05g_h100``): a
graph replayed after its step's tensors were released, fixed in ``attention_bench.graphed``.

    python3 bench/graph_eager_mix.py --shape 1,32,8,4096 --out $OUT/graph_eager_mix.jsonl

The steps are ``attention_bench``'s forward + backward rows (BF16 N(0, 1) ``q [B, Hq, S, D]``,
``k, v [B, Hkv, S, D]``, causal unless ``--non-causal``, D = 128): ``cudnn_bf16`` (torch SDPA on
cuDNN), ``fa4_bf16``, ``cute_fp8`` and ``ours_fp8`` (Triton), captured with ``attention_bench.graphed``.
Each case runs in a child process of its own, since an illegal memory access poisons the process's
CUDA context. A case ``(capture, eager)``: the ``eager`` step is built and run (as the benchmark
builds its eager rows before its graphed ones), the ``capture`` step is captured in a CUDA graph and
kept alive, then the eager step runs ``--repeats`` times, the graph is replayed once, and the eager
step runs once more; ``torch.cuda.synchronize()`` closes every stage, so the first stage that
faults is the one named. The cases: every step after its own graph; the cuDNN BF16 step (the row
that faulted first in the benchmark) after each other step's graph; and ``all``, the benchmark's
fwd+bwd group in its order: every eager step built and run (with ``--all-extra``'s: FA2 BF16 and
cuDNN FP8 through cudnn-frontend, eager only, as in the benchmark), every graph captured, then
every eager step in turn.

One JSON line per case on stdout (and in ``--out``): ``capture``, ``eager``, ``stages`` (those
passed, in order), ``eager_ok`` (the eager steps that finished after the capture, in order),
``replay_ok`` (the graphs whose replay finished, in capture order: each replay is synchronized, so a
fault in the replay stage belongs to the first graph not listed), ``ok``,
``failed_stage`` and ``error`` (the child's last exception line of stderr, else its last line) if
not, ``rc`` (the child's exit status).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import attention_bench as ab  # this folder: on sys.path when run as a script
import torch

IMPLS = ("cudnn_bf16", "fa4_bf16", "cute_fp8", "ours_fp8")  # attention_bench.GRAPHED for --recipes fp8
EAGER_ONLY = ("fa2_bf16", "cudnn_fp8")  # the benchmark's other eager rows, in the ``all`` case only
BENCH_ORDER = ("cudnn_bf16", "fa2_bf16", "cudnn_fp8", "ours_fp8", "fa4_bf16", "cute_fp8")  # its row order
STAGES = ("eager_before", "capture", "eager_after", "replay", "eager_after_replay")
ALL = "all"


def cases(impls: tuple[str, ...] = IMPLS) -> list[tuple[str, str]]:
    """``(capture, eager)`` pairs: each impl after its own graph, ``cudnn_bf16`` after each other
    impl's graph (if ``cudnn_bf16`` is among ``impls``), then ``(all, all)``."""
    out = [(name, name) for name in impls]
    if "cudnn_bf16" in impls:
        out += [(name, "cudnn_bf16") for name in impls if name != "cudnn_bf16"]
    return [*out, (ALL, ALL)]


def summarize(capture: str, eager: str, stdout: str, stderr: str, rc: int) -> dict:
    """One case's record from its child's output: the child prints ``stage <name>`` after each
    stage it finished, ``eager <name> ok`` and ``replay <name> ok`` after each step; the first stage
    of :data:`STAGES` not printed is the one that failed."""
    lines = stdout.splitlines()
    passed = [line.split(" ", 1)[1] for line in lines if line.startswith("stage ")]

    def finished(kind):
        return [line.split(" ")[1] for line in lines if line.startswith(f"{kind} ") and line.endswith(" ok")]

    rec = {"capture": capture, "eager": eager, "stages": passed, "eager_ok": finished("eager")}
    rec.update(replay_ok=finished("replay"), rc=rc)
    rec["ok"] = rc == 0 and passed == list(STAGES)
    if not rec["ok"]:
        rec["failed_stage"] = next((s for s in STAGES if s not in passed), None)
        # the exception's own line (torch follows a CUDA error with hints: CUDA_LAUNCH_BLOCKING, DSA)
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if "Error" in ln.split(":", 1)[0] or ln.startswith("timed out")]
        rec["error"] = (errors or lines or [None])[-1]
        rec["error"] = rec["error"][:300] if rec["error"] else None
    return rec


def _steps(names, shape, causal):
    """``{name: make}`` of the named forward + backward steps on one set of inputs."""
    b, hq, hkv, s = shape
    q = torch.randn(b, hq, s, ab.D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, s, ab.D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hkv, s, ab.D, device="cuda", dtype=torch.bfloat16)
    makers = {
        "cudnn_bf16": lambda: ab.sdpa_fn("cudnn_bf16", q, k, v, causal, "fwd_bwd"),
        "fa4_bf16": lambda: ab.ours_fn("bf16", q, k, v, causal, "fwd_bwd", backend="fa4"),
        "cute_fp8": lambda: ab.ours_fn("fp8", q, k, v, causal, "fwd_bwd", backend="cute"),
        "ours_fp8": lambda: ab.ours_fn("fp8", q, k, v, causal, "fwd_bwd"),
        "fa2_bf16": lambda: ab.sdpa_fn("fa2_bf16", q, k, v, causal, "fwd_bwd"),
        "cudnn_fp8": lambda: ab.cudnn_fp8_fn(q, k, v, causal, "fwd_bwd"),
    }
    return {name: makers[name] for name in names}


def child(capture: str, eager: str, shape, causal: bool, repeats: int, impls, extra=EAGER_ONLY) -> None:
    """Run one case, printing ``stage <name>`` after each stage and ``eager <name> ok`` after each
    eager step that ran after the capture (see the module docstring)."""
    if capture == ALL:
        eager_names = tuple(n for n in BENCH_ORDER if n in impls or n in extra)
        captured = tuple(n for n in BENCH_ORDER if n in impls)
    else:
        eager_names, captured = (eager,), (capture,)
    makers = _steps(tuple(dict.fromkeys(eager_names + captured)), shape, causal)

    def done(stage):
        torch.cuda.synchronize()
        print(f"stage {stage}", flush=True)

    eagers = {name: makers[name]() for name in eager_names}
    for fn in eagers.values():
        fn()
    done("eager_before")
    graphs = [ab.graphed(makers[name]()) for name in captured]
    done("capture")
    for name, fn in eagers.items():
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
        print(f"eager {name} ok", flush=True)
    done("eager_after")
    for name, replay in zip(captured, graphs):
        replay()
        torch.cuda.synchronize()  # so that a fault names the graph whose replay raised it
        print(f"replay {name} ok", flush=True)
    done("replay")
    for fn in eagers.values():
        fn()
    done("eager_after_replay")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1,32,8,4096", help="B,Hq,Hkv,S (D = 128)")
    p.add_argument("--non-causal", action="store_true")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument(
        "--all-extra",
        nargs="*",
        choices=EAGER_ONLY,
        default=list(EAGER_ONLY),
        help="eager-only steps of the benchmark's group added to the 'all' case (none: no names)",
    )
    p.add_argument("--repeats", type=int, default=20, help="eager steps after the capture")
    p.add_argument("--all-only", action="store_true", help="only the 'all' case (of --impls, --all-extra)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per case")
    p.add_argument("--out", default=None, help="also write the JSON lines here")
    p.add_argument("--child", nargs=2, metavar=("CAPTURE", "EAGER"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        shape = tuple(int(x) for x in args.shape.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        p.error(f"--shape takes four positive integers B,Hq,Hkv,S, got {args.shape!r}")
    impls = tuple(args.impls)
    if args.child:
        child(*args.child, shape, not args.non_causal, args.repeats, impls, tuple(args.all_extra))
        return 0
    records = []
    for capture, eager in [(ALL, ALL)] if args.all_only else cases(impls):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", capture, eager]
        cmd += ["--shape", args.shape, "--repeats", str(args.repeats), "--impls", *impls]
        cmd += ["--all-extra", *args.all_extra]
        cmd += ["--non-causal"] if args.non_causal else []
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
            rec = summarize(capture, eager, r.stdout, r.stderr, r.returncode)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            rec = summarize(capture, eager, out, f"timed out after {args.timeout} s", -1)
        rec.update(shape=args.shape, causal=not args.non_causal)
        print(json.dumps(rec), flush=True)
        records.append(rec)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
