"""Training throughput of the Llama-3.1-8B layer shape on one GPU: BF16 vs low-precision attention.

    python3 bench/train_throughput.py --out results/train_throughput_h200      # ~5-6 min on one H200
    python3 bench/train_throughput.py --dry-run                                  # the commands; no GPU
    python3 bench/train_throughput.py --budget-s 520 --out $OUT/train_throughput_h200   # in one 10-min window

Every (arm, micro-batch) is its own ``pretrain_llama.py`` process (clean GPU memory), run one after
the other (never two at once; the embedded corpus is prepared here once, before the first): the 8B recipe
``configs/llama3_1_8b_100b_bf16.yaml`` with ``model.num_layers=L`` (default 12; hidden 4096, 32/8
heads, head dim 128, FFN 14336, vocab 128256 as in ``model.preset=llama3_1_8b``), sequence 4096,
micro-batch 1, 2, 4 with global batch = micro-batch (no accumulation), the embedded corpus,
validation, telemetry and TensorBoard off, a log line per step, ``checkpoint.save=false`` (an 8B-shaped
checkpoint would take ~70 GB and minutes) and ``train_iters`` = warm-up + timed steps (3 + 6).

Arms (``attention.recipe`` with ``attention.backend=triton``; ``projection.precision=bf16``):
``bf16``, ``fp8``, ``nvfp4qk_fp8pv``; ``bf16+te_fp8`` and ``nvfp4qk_fp8pv+te_fp8`` (Transformer Engine
FP8 projections) are added only when ``import transformer_engine.pytorch`` works, and the output
says which.

Memory on one GPU (why L = 12): the distributed optimizer on one rank keeps 18 bytes per parameter
(BF16 weight 2 + FP32 gradient 4 + FP32 main weight 4 + Adam m, v 8), parameters = 1.05B (the two
128256 x 4096 embedding tables) + 0.218B per layer; activations ~2.3 GB per layer at micro-batch
4 x 4096 (``training/plan.py``'s estimate, no recomputation) and ~20 GB for the logits and the
cross-entropy over 128256 classes. L = 12: 3.67B x 18 = 66 GB + 27 GB + 20 GB ~ 114 GB fits in the
H200's 141 GB; L = 16: 82 + 37 + 20 ~ 139 GB does not leave room for the allocator.

Numbers per run, from its ``metrics.jsonl`` (``training/metrics.py``): the median ``step_time_s``
over the timed steps (warm-up steps excluded: Triton compilation, allocator growth), tokens/s/GPU =
micro-batch x 4096 / median step, MFU with the trainer's formula (``training/plan.py``)::

    MFU = tokens/s/GPU x flops_per_token / logging.peak_flops_per_gpu
    flops_per_token = 6 * N_matmul + 6 * L * s * Hq * d

(N_matmul: every parameter but the input embedding, the output layer included; the second term is
QK^T and PV, 2 * 2 * s * Hq * d per token and layer forward, x3 for forward + backward, halved for
the causal mask; peak 989.4 TFLOP/s = H100/H200 SXM dense BF16, for every arm), peak memory (max of
``peak_mem_gib`` = ``torch.cuda.max_memory_allocated``; and the device's peak ``memory.used`` polled
with ``nvidia-smi``, which includes the allocator's reserve and the CUDA context), the last loss
(sanity: finite).

Attention share: a separate process (before the training runs, so that they start on an empty GPU)
times the attention alone at the training shape, ``[4096, mb, 32 | 8, 128]`` (``sbhd``, as the
megatron-core adapter calls it), causal, BF16 inputs, through ``fp4_attention.attention(...,
backend="triton")`` (quantization included), forward and forward + backward, medians of
``triton.testing.do_bench``; share = L x (forward + backward) / median step. The same process
times cuDNN BF16 attention through torch SDPA (``[mb, H, S, D]``, as ``bench/attention_bench.py``):
what the ``bf16`` arm could gain with cuDNN.

Extrapolation to the 32-layer model (which does not fit on one GPU): each arm runs again at the
largest micro-batch with ``--extrapolate-from-layers`` L2 layers (default 4); the line
step_time = a + b * layers through (L2, t2) and (L, t) gives the 32-layer step time, tokens/s/GPU
on one GPU, and, times an ASSUMED data-parallel efficiency (``--dp-efficiency``, default 0.95), an
estimate for the 64-GPU recipe (``configs/llama3_1_8b_100b_*.yaml``: DP 64, micro-batch 4,
accumulation 4, distributed optimizer), printed next to the paper's GB200 numbers. The single-GPU
step includes a full (unsharded) optimizer step per micro-batch, which DP 64 shards and
accumulation 4 amortizes: the estimate is on the low side.

Order (what matters most first, for a benchmark cut short): the main runs at the largest
micro-batch, the extrapolation runs, then the other micro-batches. ``--budget-s`` skips runs that
would start too late; a SIGTERM to the benchmark (e.g. from ``timeout``) stops the running child and
writes what was measured.

Outputs (``--out PREFIX``): ``PREFIX.json`` (one record per run with every number, the exact command
and the tail of the log of a failed run; metadata: date UTC, GPU, torch / triton / megatron-core
versions, git commit (``$BENCH_COMMIT`` overrides), L) and ``PREFIX.md`` (tables, the issue's
targets with PASS/MISS, the extrapolation), both rewritten after every run. A failed run (out of
memory, non-zero exit, timeout, missing steps, non-finite loss) is recorded and the others go on;
the exit code is 1 if a run or the attention timing of a recipe failed. The markdown report is
printed last, its runs table at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BASE_CONFIG = "configs/llama3_1_8b_100b_bf16.yaml"
ARMS = {"bf16": ("bf16", "bf16"), "fp8": ("fp8", "bf16"), "nvfp4qk_fp8pv": ("nvfp4qk_fp8pv", "bf16")}
TE_ARMS = {"bf16+te_fp8": ("bf16", "te_fp8"), "nvfp4qk_fp8pv+te_fp8": ("nvfp4qk_fp8pv", "te_fp8")}
BASELINE = "bf16"
TARGET_LAYERS = 32
HQ, HKV, HEAD_DIM = 32, 8, 128
# The paper (shared/seed, §7.5 and §7.7), GB200: tokens/s/GPU, BF16 -> low precision
PAPER_64GPU = (21_853, 24_303)      # 64 GPUs, global batch 1024, NVFP4-QK/FP8-PV attention + FP8 GEMMs: 1.112x
PAPER_1GPU_B4 = (19_173, 21_795)    # 8B full update on one GPU, B4, FP8 P/V: 1.137x (MFU 41.12% -> 46.74%)
THROUGHPUT_TARGET = 1.03            # issue 9: at micro-batch 4, fp8 tokens/s >= 1.03 x bf16
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
             "SLURM_LOCALID")
GIB = 1024 ** 3
MODEL_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim", "ffn_hidden_size",
              "vocab_size")


# ------------------------------------------------------------------------------------------ runs

@dataclass
class RunSpec:
    """One ``pretrain_llama.py`` process: an arm at a micro-batch and a layer count."""

    arm: str
    micro_batch: int
    layers: int
    purpose: str                  # "main" or "extrapolation"
    output_dir: Path
    overrides: list[str]
    argv: list[str]
    plan: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.arm}_mb{self.micro_batch}_L{self.layers}"


def run_overrides(arm: str, micro_batch: int, layers: int, *, seq: int, train_iters: int, output_dir: Path,
                  extra: list[str] = ()) -> list[str]:
    """The ``section.key=value`` overrides of one run on top of :data:`BASE_CONFIG` (``extra`` last, so it wins).

    Raises:
        KeyError: an arm that is neither in :data:`ARMS` nor in :data:`TE_ARMS`.
    """
    recipe, projection = {**ARMS, **TE_ARMS}[arm]
    return [f"model.num_layers={layers}", f"attention.recipe={recipe}", "attention.backend=triton",
            f"projection.precision={projection}", "data.corpus=default", f"data.seq_length={seq}",
            f"training.micro_batch_size={micro_batch}", f"training.global_batch_size={micro_batch}",
            "training.train_tokens=null", f"training.train_iters={train_iters}", "training.warmup_iters=1",
            "validation.interval=0", "validation.iters=0", "logging.telemetry_interval=0",
            "logging.tensorboard=false", "logging.log_interval=1", "logging.progress_bar=false",
            "logging.wandb_mode=disabled", "checkpoint.save=false", "checkpoint.load=none",
            "runtime.exit_duration_mins=null", f"runtime.output_dir={output_dir}", *extra]


def plan_runs(args) -> list[RunSpec]:
    """The runs, most important first (a benchmark cut short by its time limit keeps those): the main
    runs at the largest micro-batch (the issue's targets), the extrapolation runs (same micro-batch,
    L2 layers), then the main runs at the other micro-batches, largest first; arms in order, bf16 first."""
    specs = []

    def add(arm, mb, layers, purpose):
        out = Path(args.run_dir) / f"{arm}_mb{mb}_L{layers}"
        overrides = run_overrides(arm, mb, layers, seq=args.seq, train_iters=args.warmup + args.timed,
                                  output_dir=out, extra=args.override)
        argv = [sys.executable, str(REPO / "pretrain_llama.py"), "--config", str(REPO / args.config), *overrides]
        specs.append(RunSpec(arm=arm, micro_batch=mb, layers=layers, purpose=purpose, output_dir=out,
                             overrides=overrides, argv=argv))

    largest, *others = sorted(args.micro_batches, reverse=True)
    for arm in args.arms:
        add(arm, largest, args.layers, "main")
    if args.extrapolate_from_layers and args.extrapolate_from_layers != args.layers:
        for arm in args.arms:
            add(arm, largest, args.extrapolate_from_layers, "extrapolation")
    for mb in others:
        for arm in args.arms:
            add(arm, mb, args.layers, "main")
    return specs


def validate_runs(specs: list[RunSpec], config: str) -> None:
    """Resolve every run's config and plan on one GPU, as ``pretrain_llama.py`` will (no GPU needed).

    Fills ``spec.plan`` (flops_per_token, peak FLOP/s, tokens per step, parameters, memory estimate in GiB).

    Raises:
        ValueError: a run's config or plan is invalid (the message names the run).
    """
    from training.config import load_config
    from training.plan import make_plan

    for spec in specs:
        try:
            cfg = load_config(REPO / config, spec.overrides)
            plan = make_plan(cfg, 1)
            model = cfg.llama(backend="reference")
        except (ValueError, FileNotFoundError) as err:
            raise ValueError(f"run {spec.name}: {err}") from None
        if cfg.checkpoint.save or plan.accumulation != 1:
            raise ValueError(f"run {spec.name}: expected checkpoint.save=false and no accumulation")
        spec.plan = {"flops_per_token": plan.flops_per_token, "peak_flops_per_gpu": cfg.logging.peak_flops_per_gpu,
                     "tokens_per_step": plan.tokens_per_step, "parameters": plan.parameters,
                     "memory_estimate_gib": plan.memory_bytes["total"] / GIB, "seq_length": plan.seq_length,
                     "train_iters": plan.train_iters, "recipe": cfg.attention.recipe,
                     "projection": cfg.projection.precision, "default_corpus": cfg.data.corpus == "default",
                     "data_cache_dir": cfg.data.cache_dir,
                     "model": {"preset": cfg.model.preset, **{k: getattr(model, k) for k in MODEL_KEYS}}}


def summarize_metrics(path: str | os.PathLike, *, warmup: int, timed: int, tokens_per_step: int,
                      flops_per_token: float, peak_flops: float) -> dict:
    """Throughput numbers of one run from its ``metrics.jsonl``.

    Args:
        warmup, timed: steps 1..warmup are excluded; steps warmup+1..warmup+timed are timed.
        tokens_per_step: global batch x sequence (one GPU).
        flops_per_token: training FLOPs per token (``training.plan.flops_per_token``).
        peak_flops: FLOP/s per GPU for MFU.
    Returns:
        ``median_step_s`` (s), ``step_times_s``, ``tokens_per_s_per_gpu``, ``mfu`` (fraction),
        ``mfu_trainer_median`` (the trainer's per-step MFU, median; None on CPU), ``peak_mem_gib``
        (max over all steps; None if never reported), ``last_step``, ``last_loss``, ``skipped_steps``.
    Raises:
        ValueError: fewer than ``timed`` timed steps in the file, or no train record at all.
    """
    from training.metrics import read_metrics

    trains = [r for r in read_metrics(path) if r["kind"] == "train"]
    window = [r for r in trains if warmup < r["step"] <= warmup + timed]
    if len(window) < timed:
        raise ValueError(f"{path}: {len(window)} of the {timed} timed steps (steps {warmup + 1}..{warmup + timed}) "
                         f"are in the file ({len(trains)} train records)")
    median_step = statistics.median(r["step_time_s"] for r in window)
    tps = tokens_per_step / median_step
    trainer_mfu = [r["mfu"] for r in window if r.get("mfu") is not None]
    mems = [r["peak_mem_gib"] for r in trains if r.get("peak_mem_gib") is not None]
    last = max(trains, key=lambda r: r["step"])
    return {"median_step_s": median_step, "step_times_s": [r["step_time_s"] for r in window],
            "tokens_per_s_per_gpu": tps, "mfu": tps * flops_per_token / peak_flops,
            "mfu_trainer_median": statistics.median(trainer_mfu) if len(trainer_mfu) == len(window) else None,
            "peak_mem_gib": max(mems) if mems else None, "last_step": last["step"], "last_loss": last["loss"],
            "skipped_steps": sum(bool(r["skipped"]) for r in trains)}


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def failure_reason(exit_code: int | None, timed_out: bool, tail: str, timeout_s: float) -> str:
    """A short reason for a failed process: timeout, out of (GPU) memory, a signal, or the exit code."""
    if timed_out:
        return f"timeout after {timeout_s:.0f} s"
    low = tail.lower()
    if "out of memory" in low or "outofmemoryerror" in low:
        return f"out of memory (exit code {exit_code})"
    if exit_code is not None and exit_code < 0:
        return f"killed by {signal.Signals(-exit_code).name}" + (" (host memory?)" if -exit_code == signal.SIGKILL
                                                                 else "")
    return f"exit code {exit_code}"


class DeviceMemoryPoller:
    """Polls the device's ``memory.used`` (MiB) with nvidia-smi every ``interval`` s; ``peak_gib`` (None if unavailable)."""

    def __init__(self, interval: float = 1.0):
        self.interval = interval
        self.peak_mib: float | None = None
        self._stop = threading.Event()
        self._thread = None
        exe = shutil.which("nvidia-smi")
        dev = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
        self._cmd = [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", dev] if exe else None

    def _poll(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(self._cmd, capture_output=True, text=True, timeout=10, check=True).stdout
                value = float(out.strip().splitlines()[0])
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                return
            self.peak_mib = value if self.peak_mib is None else max(self.peak_mib, value)
            self._stop.wait(self.interval)

    def __enter__(self):
        if self._cmd:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    @property
    def peak_gib(self) -> float | None:
        return None if self.peak_mib is None else self.peak_mib / 1024


def child_env() -> dict:
    """The environment of a child process: ours without rank variables (each run is one process)."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_process(argv: list[str], *, log_path: Path, timeout_s: float, poll_memory: bool = True) -> dict:
    """Run ``argv`` in its own process group with stdout+stderr to ``log_path``.

    On timeout: SIGTERM to the group (the trainer finishes its step and exits), SIGKILL after 20 s.
    Returns ``exit_code`` (-N: killed by signal N), ``timed_out``, ``wall_s`` (s), ``peak_device_mem_gib``
    (GiB, None without nvidia-smi).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log, DeviceMemoryPoller() if poll_memory else contextlib.nullcontext() as mem:
        proc = subprocess.Popen(argv, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = _stop_group(proc)
        except BaseException:  # Terminated / KeyboardInterrupt: never leave a run holding the GPU
            _stop_group(proc)
            raise
    return {"exit_code": code, "timed_out": timed_out, "wall_s": time.perf_counter() - t0,
            "peak_device_mem_gib": getattr(mem, "peak_gib", None)}


def _stop_group(proc: subprocess.Popen) -> int | None:
    """SIGTERM to the child's process group (the trainer finishes its step and exits), SIGKILL after 20 s."""
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    return proc.returncode


class Terminated(Exception):
    """The benchmark itself got SIGTERM (e.g. from ``timeout``): stop, keep what was measured."""


def _on_sigterm(signum, frame):
    # ``timeout`` signals the process and then its group: a second SIGTERM must not interrupt the clean-up
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated("SIGTERM")


def execute_run(spec: RunSpec, args, timeout_s: float) -> dict:
    """Run one spec and return its record (status ``ok`` or ``failed`` with ``failure`` and ``log_tail``)."""
    if spec.output_dir.exists():
        shutil.rmtree(spec.output_dir)  # a fresh run directory (metrics.jsonl is appended to)
    log_path = Path(args.run_dir) / f"{spec.name}.log"
    res = run_process(spec.argv, log_path=log_path, timeout_s=timeout_s)
    rec = base_record(spec, args)
    rec.update(res, log=str(log_path))
    tail = log_tail(log_path)
    if res["exit_code"] != 0 or res["timed_out"]:
        return {**rec, "status": "failed", "failure": failure_reason(res["exit_code"], res["timed_out"], tail,
                                                                     timeout_s), "log_tail": tail}
    try:
        rec.update(summarize_metrics(spec.output_dir / "metrics.jsonl", warmup=args.warmup, timed=args.timed,
                                     tokens_per_step=spec.plan["tokens_per_step"],
                                     flops_per_token=spec.plan["flops_per_token"],
                                     peak_flops=spec.plan["peak_flops_per_gpu"]))
    except (OSError, ValueError, KeyError) as err:
        return {**rec, "status": "failed", "failure": f"metrics: {err}", "log_tail": tail}
    if not math.isfinite(rec["last_loss"]):
        return {**rec, "status": "failed", "failure": f"last loss not finite ({rec['last_loss']})", "log_tail": tail}
    return {**rec, "status": "ok", "failure": None}


def base_record(spec: RunSpec, args) -> dict:
    """The part of a run's record known before it runs."""
    return {"name": spec.name, "arm": spec.arm, "attention_recipe": spec.plan["recipe"],
            "projection": spec.plan["projection"], "micro_batch": spec.micro_batch, "layers": spec.layers,
            "purpose": spec.purpose, "seq_length": spec.plan["seq_length"],
            "tokens_per_step": spec.plan["tokens_per_step"], "train_iters": spec.plan["train_iters"],
            "warmup_steps": args.warmup, "timed_steps": args.timed, "parameters": spec.plan["parameters"],
            "flops_per_token": spec.plan["flops_per_token"], "peak_flops_per_gpu": spec.plan["peak_flops_per_gpu"],
            "memory_estimate_gib": spec.plan["memory_estimate_gib"], "command": shlex.join(spec.argv),
            "output_dir": str(spec.output_dir)}


# ------------------------------------------------------------------------------- attention timing

def time_attention(recipes: list[str], micro_batches: list[int], *, seq: int, warmup_ms: int = 50, rep_ms: int = 250,
                   backend: str = "triton", device: str = "cuda", heads: tuple[int, int, int] = (HQ, HKV, HEAD_DIM),
                   timer=None) -> list[dict]:
    """Attention alone at the training shape (see the module docstring): each recipe through
    ``fp4_attention.attention(..., layout="sbhd", backend=backend)`` and cuDNN BF16 through torch SDPA.

    Args:
        heads: (query heads, key/value heads, head dim); inputs are BF16 ``[seq, mb, H, D]`` N(0, 1).
        timer: ``timer(fn, grads) -> ms`` (default: median of ``triton.testing.do_bench``, CUDA events,
            ``grads`` set to None before every call).
    Returns:
        One record per (impl, micro_batch): ``impl`` (a recipe, or ``cudnn_bf16_sdpa``), ``fwd_ms`` and
        ``fwd_bwd_ms`` (ms per layer), or ``error`` (the case could not run; the others still do).
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fp4_attention as fa

    if backend == "triton":
        import fp4_attention.triton_backend  # registers "triton"
    if timer is None:
        import triton

        def timer(fn, grads):
            return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grads,
                                                 return_mode="median"))

    def fwd_and_fwd_bwd(fn, inputs, grad_out) -> dict:
        with torch.no_grad():
            fwd = timer(lambda: fn(*inputs), None)
        leaves = [t.detach().requires_grad_() for t in inputs]
        return {"fwd_ms": fwd, "fwd_bwd_ms": timer(lambda: fn(*leaves).backward(grad_out), leaves)}

    def cudnn(a, b, c):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)

    hq, hkv, d = heads
    out = []
    torch.manual_seed(0)
    for mb in micro_batches:
        q = torch.randn(seq, mb, hq, d, device=device, dtype=torch.bfloat16)
        k, v = (torch.randn(seq, mb, hkv, d, device=device, dtype=torch.bfloat16) for _ in range(2))
        dout = torch.randn_like(q)
        cases = {r: (lambda a, b, c, r=r: fa.attention(a, b, c, recipe=r, causal=True, layout="sbhd",
                                                       backend=backend), (q, k, v), dout) for r in recipes}
        bhsd = tuple(t.permute(1, 2, 0, 3).contiguous() for t in (q, k, v))
        cases["cudnn_bf16_sdpa"] = (cudnn, bhsd, dout.permute(1, 2, 0, 3).contiguous())
        for impl, (fn, inputs, grad_out) in cases.items():
            rec = {"impl": impl, "micro_batch": mb, "seq_length": seq, "heads": f"{hq}/{hkv}", "head_dim": d,
                   "layout": "bhsd" if impl == "cudnn_bf16_sdpa" else "sbhd"}
            try:
                rec.update(fwd_and_fwd_bwd(fn, inputs, grad_out))
            except Exception as err:  # noqa: BLE001 - reported in the output, the other cases go on
                rec["error"] = f"{type(err).__name__}: {str(err)[:300]}"
            out.append(rec)
            print(json.dumps(rec), flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    return out


def run_attention_timing(args, recipes: list[str]) -> tuple[list[dict], str | None]:
    """Time the attention in a child process (this one never holds a CUDA context); (records, error)."""
    import torch

    if not torch.cuda.is_available():
        return [], "skipped: no CUDA device"
    out = Path(args.run_dir) / "attention_timing.json"
    out.unlink(missing_ok=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "--attention-timing-json", str(out), "--seq", str(args.seq),
            "--micro-batches", *map(str, args.micro_batches), "--attention-recipes", *recipes]
    print(f"attention timing: {shlex.join(argv)}", flush=True)
    res = run_process(argv, log_path=Path(args.run_dir) / "attention_timing.log", timeout_s=args.attention_timeout,
                      poll_memory=False)
    print(f"attention timing: exit {res['exit_code']} in {res['wall_s']:.0f} s", flush=True)
    if res["exit_code"] != 0 or not out.exists():
        tail = log_tail(Path(args.run_dir) / "attention_timing.log", 15)
        return [], f"failed ({failure_reason(res['exit_code'], res['timed_out'], tail, args.attention_timeout)}): {tail}"
    return json.loads(out.read_text()), None


# ------------------------------------------------------------------------------------- analysis

def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``y = a + b * x`` (exact through two points); returns (a, b).

    Raises:
        ValueError: fewer than two distinct x.
    """
    xs = {x for x, _ in points}
    if len(xs) < 2:
        raise ValueError(f"need two distinct layer counts to fit a line, got {sorted(xs)}")
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - b * mx, b


def derive(records: list[dict], attention: list[dict]) -> None:
    """Add ``attention_*`` (per layer, x layers, share of the step) and ratios vs the bf16 arm, in place."""
    timing = {(a["impl"], a["micro_batch"]): a for a in attention if "error" not in a}
    base = {(r["micro_batch"], r["layers"]): r for r in records if r["arm"] == BASELINE and r["status"] == "ok"}
    for r in records:
        t = timing.get((r["attention_recipe"], r["micro_batch"]))
        r["attention_fwd_ms"] = t["fwd_ms"] if t else None
        r["attention_fwd_bwd_ms"] = t["fwd_bwd_ms"] if t else None
        ok = r["status"] == "ok"
        r["attention_share"] = (r["layers"] * t["fwd_bwd_ms"] / (1e3 * r["median_step_s"])) if t and ok else None
        b = base.get((r["micro_batch"], r["layers"]))
        r["tokens_vs_bf16"] = r["tokens_per_s_per_gpu"] / b["tokens_per_s_per_gpu"] if ok and b else None
        both = ok and b and r.get("peak_mem_gib") is not None and b.get("peak_mem_gib") is not None
        r["peak_mem_vs_bf16"] = r["peak_mem_gib"] / b["peak_mem_gib"] if both else None


def extrapolate(records: list[dict], *, dp_efficiency: float, target_layers: int = TARGET_LAYERS) -> list[dict]:
    """Per arm: the 32-layer step time from the line through its runs at the extrapolation micro-batch.

    Uses every ``ok`` record of the arm at the micro-batch of its ``extrapolation`` runs (two layer
    counts: exact line). Returns dicts with ``a_s``, ``b_s_per_layer``, ``step_s``, ``tokens_per_s_1gpu``,
    ``tokens_per_s_per_gpu_64_est`` (x ``dp_efficiency``), ``mfu`` (FLOPs per token at 32 layers, on
    the line through the runs' own values, which are linear in the layer count; the runs' peak),
    ``vs_bf16``; or ``error``.
    """
    out = []
    for arm in dict.fromkeys(r["arm"] for r in records if r["purpose"] == "extrapolation"):
        mb = max(r["micro_batch"] for r in records if r["arm"] == arm and r["purpose"] == "extrapolation")
        pts = [r for r in records if r["arm"] == arm and r["micro_batch"] == mb and r["status"] == "ok"]
        rec = {"arm": arm, "micro_batch": mb, "points": [(r["layers"], r["median_step_s"]) for r in pts]}
        try:
            a, b = fit_line(rec["points"])
        except ValueError as err:
            out.append({**rec, "error": str(err)})
            continue
        step = a + b * target_layers
        if not (b > 0 and step > 0):
            out.append({**rec, "error": f"the step time does not grow with the layer count (b = {b:.4g} s/layer)"})
            continue
        tps = pts[0]["tokens_per_step"] / step
        f0, f1 = fit_line([(r["layers"], r["flops_per_token"]) for r in pts])
        fpt = f0 + f1 * target_layers
        out.append({**rec, "a_s": a, "b_s_per_layer": b, "layers": target_layers, "step_s": step,
                    "tokens_per_s_1gpu": tps, "tokens_per_s_per_gpu_64_est": tps * dp_efficiency,
                    "dp_efficiency": dp_efficiency, "flops_per_token": fpt,
                    "mfu": tps * fpt / pts[0]["peak_flops_per_gpu"]})
    base = next((e for e in out if e["arm"] == BASELINE and "error" not in e), None)
    for e in out:
        e["vs_bf16"] = e["tokens_per_s_1gpu"] / base["tokens_per_s_1gpu"] if base and "error" not in e else None
    return out


def targets(records: list[dict]) -> list[dict]:
    """The issue's targets at the largest micro-batch of the main runs: ``target``, ``measured``, ``result``."""
    main = [r for r in records if r["purpose"] == "main"]
    if not main:
        return []
    mb = max(r["micro_batch"] for r in main)
    by = {(r["arm"], r["micro_batch"]): r for r in main}
    out = []
    for arm in dict.fromkeys(r["arm"] for r in main if r["arm"] != BASELINE):
        r, b = by.get((arm, mb)), by.get((BASELINE, mb))
        label = f"micro-batch {mb}: {arm} tokens/s/GPU >= {THROUGHPUT_TARGET:.2f}x bf16" + (
            "" if arm == "fp8" else " (the fp8 target's bar, for reference)")
        if r is None or b is None or r.get("tokens_vs_bf16") is None:
            out.append({"target": label, "measured": "not measured (a run failed)", "result": "MISS"})
        else:
            ratio = r["tokens_vs_bf16"]
            out.append({"target": label, "measured": f"{r['tokens_per_s_per_gpu']:,.0f} vs "
                        f"{b['tokens_per_s_per_gpu']:,.0f} = {ratio:.3f}x",
                        "result": "PASS" if ratio >= THROUGHPUT_TARGET else "MISS"})
    for arm in dict.fromkeys(r["arm"] for r in main if r["arm"] != BASELINE):
        parts, ok = [], True
        for m in sorted({r["micro_batch"] for r in main}):
            r, b = by.get((arm, m)), by.get((BASELINE, m))
            if r is None or b is None or r.get("peak_mem_vs_bf16") is None:
                parts.append(f"mb{m} not measured")
                ok = False
            else:
                parts.append(f"mb{m} {r['peak_mem_gib']:.1f} vs {b['peak_mem_gib']:.1f} GiB")
                ok &= r["peak_mem_gib"] <= b["peak_mem_gib"]
        out.append({"target": f"peak memory (max allocated) of {arm} <= bf16 at every micro-batch",
                    "measured": "; ".join(parts), "result": "PASS" if ok else "MISS"})
    return out


# ------------------------------------------------------------------------------------- report

def _f(x, fmt: str, none: str = "-") -> str:
    """``x`` formatted (a trailing ``%`` or ``x`` in ``fmt`` is a literal suffix), or ``none``."""
    if x is None:
        return none
    suffix = fmt[-1] if fmt[-1] in "%x" else ""
    return format(x, fmt[:-1] if suffix else fmt) + suffix


def _md_header(meta: dict) -> list[str]:
    L, m = meta["layers"], meta["model"]
    flops = f" = {meta['flops_per_token_main']:.4e} at {L} layers" if meta.get("flops_per_token_main") else ""
    return [
        f"# Training throughput, {m['preset']} layer shape x {L} layers, {meta['gpu']}", "",
        (f"- date {meta['date']}, commit {meta['commit']}, torch {meta['torch']}, triton {meta['triton']}, "
         f"megatron-core {meta['megatron_core']}, python {meta['python']}"),
        (f"- {L} layers of hidden {m['hidden_size']}, {m['num_attention_heads']}/{m['num_kv_heads']} heads, head dim "
         f"{m['head_dim']}, FFN {m['ffn_hidden_size']}, vocab {m['vocab_size']}; sequence {meta['seq_length']}, "
         f"global batch = micro-batch on one GPU, {meta['warmup_steps']} warm-up + {meta['timed_steps']} timed "
         "steps per run (median step time of the timed steps); no checkpoints written"),
        f"- {meta['transformer_engine']}",
        *([f"- STOPPED: {meta['terminated']}; the runs not completed are marked as such"]
          if meta.get("terminated") else []),
        (f"- MFU = tokens/s/GPU x flops_per_token / {meta['peak_flops_per_gpu'] / 1e12:.1f} TFLOP/s "
         f"({meta['peak_note']}); flops_per_token = 6*N_matmul + 6*L*s*Hq*d{flops} (training/plan.py: N_matmul = "
         "all parameters but the input embedding; attention QK^T + PV, x3 forward+backward, /2 causal)"),
        ("- peak GiB: max of torch.cuda.max_memory_allocated (metrics.jsonl); device GiB: peak nvidia-smi "
         "memory.used while the run ran (allocator reserve + CUDA context)"),
        ("- attention share = layers x attention forward+backward time (alone, same shape, backend and recipe, "
         "quantization included) / median step time")]


def _md_runs(records: list[dict]) -> list[str]:
    lines = ["## Runs", "",
             ("| arm | attention | projections | micro-batch | median step ms | tokens/s/GPU | MFU | peak GiB | "
              "device GiB | attention share | vs bf16 | last loss | wall s | status |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    arms = list(dict.fromkeys(r["arm"] for r in records))
    for r in sorted((r for r in records if r["purpose"] == "main"), key=lambda r: (r["micro_batch"],
                                                                                   arms.index(r["arm"]))):
        ok = r["status"] == "ok"
        status = "ok" if ok else f"FAILED: {r['failure']}"
        share = r.get("attention_share")
        lines.append(
            f"| {r['arm']} | {r['attention_recipe']} | {r['projection']} | {r['micro_batch']} | "
            f"{_f(1e3 * r['median_step_s'] if ok else None, '.1f')} | "
            f"{_f(r['tokens_per_s_per_gpu'] if ok else None, ',.0f')} | {_f(100 * r['mfu'] if ok else None, '.1f%')} | "
            f"{_f(r.get('peak_mem_gib'), '.1f')} | {_f(r.get('peak_device_mem_gib'), '.1f')} | "
            f"{_f(100 * share if share is not None else None, '.1f%')} | {_f(r.get('tokens_vs_bf16'), '.3fx')} | "
            f"{_f(r['last_loss'] if ok else None, '.3f')} | {_f(r.get('wall_s'), '.0f')} | {status} |")
    return lines


def _md_attention(report: dict) -> list[str]:
    L = report["meta"]["layers"]
    lines = ["## Attention alone (per layer)", ""]
    if report.get("attention_error"):
        lines.append(f"- attention timing {report['attention_error'][:400]}")
    if not report["attention"]:
        return lines
    lines += ["| impl | micro-batch | layout | fwd ms | fwd+bwd ms | fwd+bwd x layers ms |", "|---|---|---|---|---|---|"]
    for a in report["attention"]:
        if "error" in a:
            lines.append(f"| {a['impl']} | {a['micro_batch']} | {a['layout']} | error: {a['error'][:80]} | - | - |")
        else:
            lines.append(f"| {a['impl']} | {a['micro_batch']} | {a['layout']} | {a['fwd_ms']:.3f} | "
                         f"{a['fwd_bwd_ms']:.3f} | {L * a['fwd_bwd_ms']:.1f} |")
    cudnn = {a["micro_batch"]: a for a in report["attention"] if a["impl"] == "cudnn_bf16_sdpa" and "error" not in a}
    for r in report["records"]:
        c = cudnn.get(r["micro_batch"])
        if r["purpose"] == "main" and r["arm"] == BASELINE and r["status"] == "ok" and c and r["attention_fwd_bwd_ms"]:
            gain = r["layers"] * (r["attention_fwd_bwd_ms"] - c["fwd_bwd_ms"])
            lines.append(f"- bf16 arm, micro-batch {r['micro_batch']}: cuDNN BF16 attention instead of ours would save "
                         f"~{gain:.1f} ms of the {1e3 * r['median_step_s']:.1f} ms step (estimate: "
                         f"{r['tokens_per_step'] / (r['median_step_s'] - gain / 1e3):,.0f} tokens/s/GPU)")
    return lines


def _md_extrapolation(report: dict) -> list[str]:
    ex, meta = report["extrapolation"], report["meta"]
    lines = [f"## Extrapolation to {TARGET_LAYERS} layers (estimate)", ""]
    if not ex:
        return [*lines, "- not run (--extrapolate-from-layers 0)"]
    lines += [(f"- per arm, step_time = a + b x layers through its runs at micro-batch {ex[0]['micro_batch']}; "
               f"64-GPU tokens/s/GPU = the {TARGET_LAYERS}-layer single-GPU value x an ASSUMED data-parallel "
               f"efficiency of {meta['dp_efficiency']:.2f} (the recipe configs/llama3_1_8b_100b_*.yaml: DP 64, "
               "micro-batch 4, accumulation 4, distributed optimizer); the single-GPU step includes a full "
               "unsharded optimizer step per micro-batch, so this is on the low side"), "",
              ("| arm | points (layers, step s) | a s | b s/layer | 32-layer step s | tokens/s/GPU 1 GPU | MFU | "
               "tokens/s/GPU 64 GPUs (est.) | vs bf16 |"), "|---|---|---|---|---|---|---|---|---|"]
    for e in ex:
        pts = ", ".join(f"({n}, {t:.3f})" for n, t in e["points"])
        if "error" in e:
            lines.append(f"| {e['arm']} | {pts} | error: {e['error']} | | | | | | |")
        else:
            lines.append(f"| {e['arm']} | {pts} | {e['a_s']:.3f} | {e['b_s_per_layer']:.4f} | {e['step_s']:.3f} | "
                         f"{e['tokens_per_s_1gpu']:,.0f} | {100 * e['mfu']:.1f}% | "
                         f"{e['tokens_per_s_per_gpu_64_est']:,.0f} | {_f(e['vs_bf16'], '.3fx')} |")
    lines.append(f"- the paper (GB200, another GPU: compare ratios, not absolute numbers): 64 GPUs {PAPER_64GPU[0]:,} "
                 f"-> {PAPER_64GPU[1]:,} tokens/s/GPU (BF16 -> NVFP4-QK/FP8-PV attention + FP8 GEMMs, "
                 f"{PAPER_64GPU[1] / PAPER_64GPU[0]:.3f}x); one GPU, 8B full update at B4 (FP8 P/V): "
                 f"{PAPER_1GPU_B4[0]:,} -> {PAPER_1GPU_B4[1]:,} tokens/s ({PAPER_1GPU_B4[1] / PAPER_1GPU_B4[0]:.3f}x)")
    return lines


def to_markdown(report: dict, *, terminal: bool = False) -> str:
    """The markdown report of ``report`` (the JSON document of :func:`build_report`).

    The file (``terminal=False``): header, runs table, targets, attention, extrapolation, failed runs
    with their log tails, commands. ``terminal=True``: no log tails and no commands, the runs table last.
    """
    records = report["records"]
    targets_ = ["## Targets (issue 9)", ""] + (
        [f"- {t['result']}: {t['target']}: {t['measured']}" for t in report["targets"]] or ["- no main runs"])
    failed = []
    for r in (r for r in records if r["status"] != "ok"):
        failed.append(f"- {r['name']}: {r['failure']} (log {r.get('log', '-')})")
        if not terminal and r.get("log_tail"):
            failed += ["", "```", r["log_tail"], "```", ""]
    failed = ["## Failed runs", "", *failed] if failed else []
    sections = [_md_header(report["meta"]), targets_, _md_attention(report), _md_extrapolation(report), failed]
    if terminal:
        sections.append(_md_runs(records))
    else:
        sections.insert(1, _md_runs(records))
        sections.append(["## Commands", "", *(f"- `{r['command']}`" for r in records)])
    return "\n\n".join("\n".join(sec) for sec in sections if sec) + "\n"


def metadata(args, te_note: str) -> dict:
    """Date UTC, GPU (nvidia-smi: no CUDA context here), versions, commit, and the benchmark's settings."""
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    try:
        from importlib.metadata import version
        mcore = version("megatron-core")
    except Exception:  # noqa: BLE001
        mcore = "unknown"
    gpu = "no GPU"
    if shutil.which("nvidia-smi"):
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=20, check=True).stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            gpu = "unknown GPU (nvidia-smi failed)"
    commit = os.environ.get("BENCH_COMMIT")
    if not commit:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             check=False)
        commit = git.stdout.strip() or "unknown"
        if git.returncode == 0 and subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                                  capture_output=True, text=True, check=False).stdout.strip():
            commit += "+uncommitted changes"
    return {"date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "gpu": gpu, "torch": torch.__version__,
            "triton": triton_version, "megatron_core": mcore, "python": sys.version.split()[0], "commit": commit,
            "layers": args.layers, "seq_length": args.seq, "micro_batches": args.micro_batches, "arms": args.arms,
            "warmup_steps": args.warmup, "timed_steps": args.timed, "extrapolate_from_layers":
            args.extrapolate_from_layers, "dp_efficiency": args.dp_efficiency, "transformer_engine": te_note,
            "base_config": args.config, "extra_overrides": args.override}


def prepare_default_corpus(cache_dir: str | None) -> None:
    """Prepare the embedded corpus here, once, before any run (the runs then only read it); a failure is
    printed and left to the runs to report."""
    from data import ensure_default_corpus

    t0 = time.perf_counter()
    try:
        ensure_default_corpus(cache_dir, log=lambda m: print(f"data: {m}", flush=True))
    except Exception as err:  # noqa: BLE001 - every run will fail with the same message, recorded per run
        print(f"data: preparing the default corpus failed: {type(err).__name__}: {err}", flush=True)
        return
    print(f"data: default corpus ready in {time.perf_counter() - t0:.0f} s", flush=True)


def transformer_engine_status() -> tuple[bool, str]:
    """(usable, a sentence for the output): whether ``import transformer_engine.pytorch`` works (child process)."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False, ("Transformer Engine is not installed on this machine (`import transformer_engine` fails: "
                       "No module named 'transformer_engine'): no FP8 (TE) projection arms; every arm uses BF16 "
                       "projections")
    try:
        code = "import transformer_engine as t, transformer_engine.pytorch; print(t.__version__)"
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env=child_env(), check=False)
    except subprocess.TimeoutExpired:
        return False, "Transformer Engine: `import transformer_engine.pytorch` timed out: no FP8 (TE) projection arms"
    if res.returncode != 0:
        err = (res.stderr.strip().splitlines() or ["?"])[-1][:200]
        return False, (f"Transformer Engine does not import on this machine ({err}): no FP8 (TE) projection arms; "
                       "every arm uses BF16 projections")
    return True, (f"Transformer Engine {res.stdout.strip()} imports: FP8 (TE) projection arms "
                  f"{', '.join(TE_ARMS)} added")


# ----------------------------------------------------------------------------------------- main

def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line (see ``--help``); exits with a usage error for impossible values."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", help="output prefix: writes PREFIX.json and PREFIX.md (after every run)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the commands; run nothing")
    p.add_argument("--layers", type=int, default=12, help="model.num_layers of the main runs (default 12)")
    p.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--arms", nargs="+", choices=[*ARMS, *TE_ARMS], default=None,
                   help=f"default: {', '.join(ARMS)}, plus {', '.join(TE_ARMS)} when Transformer Engine imports")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps at the start of each run (default 3)")
    p.add_argument("--timed", type=int, default=6, help="timed steps after the warm-up (default 6)")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--extrapolate-from-layers", type=int, default=4,
                   help="second layer count for the 32-layer extrapolation, at the largest micro-batch (0 = off)")
    p.add_argument("--dp-efficiency", type=float, default=0.95,
                   help="ASSUMED data-parallel efficiency for the 64-GPU estimate (default 0.95)")
    p.add_argument("--timeout", type=float, default=150, help="seconds per training run (default 150)")
    p.add_argument("--attention-timeout", type=float, default=180, help="seconds for the attention timing")
    p.add_argument("--budget-s", type=float, default=0,
                   help="wall-clock budget of the whole benchmark: runs that would start after it are skipped "
                        "(reported as failed) and timeouts shrink to fit (0 = none)")
    p.add_argument("--run-dir", default=str(REPO / "runs" / "train_throughput"),
                   help="run directories and logs of the training processes")
    p.add_argument("--config", default=BASE_CONFIG, help=f"base config, relative to the repo (default {BASE_CONFIG})")
    p.add_argument("--override", nargs="+", default=[], metavar="section.key=value",
                   help="extra overrides appended to every run (they win), e.g. data.cache_dir=/scratch/data")
    p.add_argument("--no-attention-timing", action="store_true", help="skip the attention-alone timing")
    # internal: the attention timing child process
    p.add_argument("--attention-timing-json", help=argparse.SUPPRESS)
    p.add_argument("--attention-recipes", nargs="+", default=[], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.warmup < 1 or args.timed < 1 or args.layers < 1 or min(args.micro_batches) < 1:
        p.error("--warmup, --timed, --layers and --micro-batches must be >= 1")
    if args.extrapolate_from_layers < 0 or not 0 < args.dp_efficiency <= 1:
        p.error("--extrapolate-from-layers must be >= 0 and --dp-efficiency in (0, 1]")
    args.micro_batches = sorted(set(args.micro_batches))
    return args


def build_report(meta, records, attention, attention_error, dp_efficiency) -> dict:
    """The JSON document (derived columns, targets and extrapolation recomputed from the records)."""
    derive(records, attention)
    return {"meta": meta, "records": records, "attention": attention, "attention_error": attention_error,
            "targets": targets(records), "extrapolation": extrapolate(records, dp_efficiency=dp_efficiency)}


def write_outputs(prefix: str | None, report: dict) -> None:
    """Write ``PREFIX.json`` and ``PREFIX.md`` (nothing when ``prefix`` is None)."""
    if not prefix:
        return
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    Path(prefix + ".json").write_text(json.dumps(report, indent=1, allow_nan=True))
    Path(prefix + ".md").write_text(to_markdown(report))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit code: 0 all ran, 1 something failed, 2 an invalid run config."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.attention_timing_json:  # the child process of run_attention_timing
        recs = time_attention(args.attention_recipes, args.micro_batches, seq=args.seq)
        Path(args.attention_timing_json).write_text(json.dumps(recs, indent=1))
        return 0
    t_start = time.perf_counter()
    # megatron-core warns at import about optional packages (TE, Apex); each run's log says what it uses
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.core\..*")
    te_ok, te_note = transformer_engine_status()
    print(te_note, flush=True)
    if args.arms is None:
        args.arms = [*ARMS, *(TE_ARMS if te_ok else ())]
    elif BASELINE not in args.arms:
        args.arms = [BASELINE, *args.arms]  # every ratio is against the bf16 arm
    specs = plan_runs(args)
    try:
        validate_runs(specs, args.config)
    except ValueError as err:
        print(f"train_throughput: {err}", file=sys.stderr)
        return 2
    for i, s in enumerate(specs, 1):
        print(f"[{i}/{len(specs)}] {s.name} ({s.purpose}; plan estimate {s.plan['memory_estimate_gib']:.1f} GiB, "
              f"{s.plan['parameters'] / 1e9:.2f}B parameters): {shlex.join(s.argv)}", flush=True)
    if args.dry_run:
        return 0
    meta = metadata(args, te_note)
    main_specs = [s for s in specs if s.purpose == "main"]
    meta["peak_flops_per_gpu"] = main_specs[0].plan["peak_flops_per_gpu"]
    meta["flops_per_token_main"] = main_specs[0].plan["flops_per_token"]
    meta["model"] = main_specs[0].plan["model"]
    meta["peak_note"] = ("logging.peak_flops_per_gpu; 989.4e12 = H100/H200 SXM dense BF16" if
                         meta["peak_flops_per_gpu"] == 989.4e12 else "logging.peak_flops_per_gpu, NOT the H200's "
                         "989.4e12 dense BF16")
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _measure(args, specs, meta, t_start)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _measure(args, specs: list[RunSpec], meta: dict, t_start: float) -> int:
    """The attention timing and the runs, in order; writes and prints the report; returns the exit code."""
    attention, attention_error = [], ("skipped (--no-attention-timing)" if args.no_attention_timing else "not run")
    records = []
    try:
        if specs[0].plan["default_corpus"]:
            prepare_default_corpus(specs[0].plan["data_cache_dir"])
        if not args.no_attention_timing:
            attention, attention_error = run_attention_timing(args, list(dict.fromkeys(s.plan["recipe"]
                                                                                       for s in specs)))
        for i, spec in enumerate(specs, 1):
            left = args.budget_s - (time.perf_counter() - t_start) if args.budget_s else math.inf
            if left < 30:
                rec = {**base_record(spec, args), "status": "failed", "failure": "not run: --budget-s reached"}
            else:
                print(f"[{i}/{len(specs)}] {spec.name}: running", flush=True)
                rec = execute_run(spec, args, timeout_s=min(args.timeout, left))
            records.append(rec)
            if rec["status"] == "ok":
                print(f"[{i}/{len(specs)}] {spec.name}: ok in {rec['wall_s']:.0f} s: median step "
                      f"{1e3 * rec['median_step_s']:.1f} ms, {rec['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, MFU "
                      f"{100 * rec['mfu']:.1f}%, peak {_f(rec['peak_mem_gib'], '.1f')} GiB, last loss "
                      f"{rec['last_loss']:.3f}", flush=True)
            else:
                print(f"[{i}/{len(specs)}] {spec.name}: FAILED ({rec['failure']}) after {rec.get('wall_s', 0):.0f} s"
                      + (f"\n{rec['log_tail'][-3000:]}" if rec.get("log_tail") else ""), flush=True)
            write_outputs(args.out, build_report(meta, records, attention, attention_error, args.dp_efficiency))
    except (Terminated, KeyboardInterrupt) as err:
        meta["terminated"] = f"the benchmark was stopped ({err or 'SIGINT'}) after {time.perf_counter() - t_start:.0f} s"
        print(f"train_throughput: {meta['terminated']}; writing what was measured", flush=True)
        if attention_error == "not run":
            attention_error = f"failed ({meta['terminated']})"
        done = {r["name"] for r in records}
        records += [{**base_record(s, args), "status": "failed", "failure": f"not completed: {meta['terminated']}"}
                    for s in specs if s.name not in done]
    report = build_report(meta, records, attention, attention_error, args.dp_efficiency)
    meta["total_wall_s"] = time.perf_counter() - t_start
    write_outputs(args.out, report)
    print(f"total wall time {meta['total_wall_s']:.0f} s" + (f"; wrote {args.out}.json and .md" if args.out else ""))
    print(to_markdown(report, terminal=True))
    # a failed run, or a missing attention share (the cuDNN control's errors are only reported)
    failed = any(r["status"] != "ok" for r in records) or (attention_error or "").startswith("failed") or any(
        "error" in a for a in attention if a["impl"] != "cudnn_bf16_sdpa")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
