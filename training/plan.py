"""The run plan: parallel layout, batch arithmetic, steps, memory and FLOPs of a config at a world size.

Used by ``pretrain_llama.py --dry-run`` (no GPU, no data) and by the trainer at start-up, so an
impossible combination stops before anything is built, with a message saying what to change.

FLOPs per token (MFU numerator), forward + backward, the standard 6N + attention count::

    flops_per_token = 6 * N_matmul + 6 * L * s * (Hq * d)

* ``N_matmul``: every parameter except the input embedding table (the output layer included; the
  few norm weights are counted too, a <0.01% difference);
* ``6 * L * s * Hq * d``: the attention score and value products, 2 * 2 * s * Hq * d FLOPs per token
  and layer forward (QK^T and PV), times 3 for forward + backward, halved for the causal mask
  (``Hq * d`` equals the hidden size in the Llama-3.1 shapes).

MFU = tokens/s/GPU * flops_per_token / peak FLOP/s per GPU (``logging.peak_flops_per_gpu``,
989.4e12 = H100/H200 dense BF16). Quantized attention runs partly in FP8, but MFU is stated
against the BF16 peak so that recipes compare on one scale.

Memory per GPU (bytes; P = parameters on the heaviest pipeline stage / TP):

* weights ``2 P`` (BF16); gradients ``4 P`` (megatron-core's FP32 ``main_grad`` buffer,
  ``grad_reduce_in_fp32``); optimizer ``12 P / DP`` (FP32 main weights, Adam m and v, sharded by
  the distributed optimizer);
* activations, an estimate without recomputation, saved tensors per token and layer in BF16:
  ``2 * (4h + (2 Hq + 2 Hkv) d + 3 f) + 4 Hq`` bytes (norm inputs/outputs, QKV, attention output,
  SwiGLU input and output, FP32 log-sum-exp; ~34 h for Llama-8B, as Korthikanti et al. 2022 count
  for flash-style attention), the TP-split parts divided by TP (the 4h by TP only with sequence
  parallelism), times the micro-batch tokens, the layers of a stage and the micro-batches in
  flight on the first stage (min(PP, accumulation) under 1F1B), plus the logits (BF16 + FP32
  softmax, ``6 V / TP`` bytes per token). Quantized attention saves less than this BF16 figure.
  Our core attention keeps its BF16 output for its backward and ``linear_proj`` saves the sbhd copy
  it returns: ``2 Hq d`` bytes more. Two terms depend on the layer spec (:func:`layer_spec_of`):

  - megatron-core's local spec (no Transformer Engine) saved ``LOCAL_SPEC_EXTRA_H * h`` = 16.5 h bytes
    per token and layer more than the TE spec on the H200 (the slope over 4 and 12 layers of the two
    specs' peak allocations, below). Which tensors make it up is not established: on the CPU its
    ``torch.nn.RMSNorm`` saves three FP32 ``[tokens, h]`` tensors per norm where TE's fused norm
    saves the BF16 input (20 h for the two norms), but torch 2.11 also has a fused CUDA RMSNorm;
  - TE FP8 projections (``te_fp8``): TE saves the inputs of its projections in FP8 for the weight
    gradient; the H200 runs fit ``2h + f`` bytes per token and layer less (the two norm outputs and
    the SwiGLU output; not the attention output), in the first stage's FP8 layers.

  Checked against every H200 run at micro-batch 4 whose peak lies in forward/backward
  (``results/train_throughput_h200.json``: local spec; ``results/te_h200/``: TE spec, BF16 and FP8
  projections; 4 and 12 layers of the 8B shape): the BF16-attention runs peaked 0.33-0.36 GiB above
  this estimate, the quantized-attention runs 0.5-3.1 GiB below it
  (``test_memory_estimate_against_the_h200_runs``).
* checkpoint: ``14 N`` bytes (BF16 model, FP32 main weights, Adam m and v), ``checkpoint.keep_last``
  of them on disk, one more while the next is written (the oldest goes once the new one is complete).

Time (``--dry-run``, :func:`estimate_time`): training FLOPs ``train_iters * tokens_per_step *
flops_per_token`` over ``world_size * MFU * peak``, with a stated MFU assumption
(:data:`ASSUMED_MFU`, ``--mfu``) and the config's peak; GPU-hours = wall clock x world size. The
memory estimate is checked against one GPU's memory (:func:`format_estimate`: the visible GPU's,
else an H200's, or ``--gpu-memory-gib``); above it the dry run warns.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from .config import TrainConfig

__all__ = [
    "ASSUMED_MFU",
    "H200_MEMORY_BYTES",
    "Estimate",
    "estimate_time",
    "flops_per_token",
    "format_estimate",
    "layer_spec_of",
    "format_plan",
    "make_plan",
    "memory_verdict",
    "MEMORY_REMEDY",
    "NO_FIT_REMEDY",
    "OTHER_MEMORY_REMEDY",
    "check_corpus",
    "corpus_warning",
    "missing_data_warnings",
    "out_of_memory_text",
    "smaller_micro_batch",
]

GIB = 1024**3
# The MFU the time estimate assumes: the BF16 arm measured 44.0% (Llama-3.1-8B layer shape x 12,
# micro-batch 4, one H200; fp8 41.1%, nvfp4qk_fp8pv 39.7%: results/train_throughput_h200.md); 40%
# leaves some of it for the data-parallel gradient reduction of a multi-GPU run.
ASSUMED_MFU = 0.40
H200_MEMORY_BYTES = 143_771 * 1024**2  # nvidia-smi's memory.total of an H200 (140.4 GiB)
# Device memory the plan's estimate leaves out (CUDA context, allocator reserve): nvidia-smi's peak
# minus max_memory_allocated was 3.4-17.6 GiB in the runs of results/train_throughput_h200.json and
# results/te_h200/train_throughput_te_h200*.json (tests/training/test_plan.py derives the range).
UNCOUNTED_GIB = (3.4, 17.6)
# Bytes per token and layer, in units of the hidden size, that megatron-core's local spec saved beyond
# the TE spec on the H200: the slope over 4 and 12 layers of (local - TE) peak allocation at micro-batch
# 4, BF16 attention (16.56 h; tests/training/test_plan.py derives it from the two results files).
LOCAL_SPEC_EXTRA_H = 16.5
# What lowers the memory per GPU, worded for the dry run's warning and the out-of-memory exit: the
# micro-batch (activations only), and what also moves weights and optimizer state
_LOWER_MB = "lower training.micro_batch_size"
_SHARD = "raise parallel.tensor (with parallel.sequence_parallel=true) or parallel.pipeline"
_MORE_GPUS = "use more GPUs (the optimizer state is sharded over data parallel)"
OTHER_MEMORY_REMEDY = (
    f"{_SHARD}, {_MORE_GPUS}, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less fragmentation)"
)
MEMORY_REMEDY = f"{_LOWER_MB}, {OTHER_MEMORY_REMEDY}"
# where the estimate exceeds the GPU's memory: less fragmentation cannot make it fit, so the dry run's
# warning leaves expandable_segments out (found by a new-user review: it was offered for a 50 GiB gap)
NO_FIT_REMEDY = f"{_LOWER_MB}, {_SHARD}, or {_MORE_GPUS}"


def flops_per_token(llama, seq_length: int) -> float:
    """Training FLOPs per token of ``llama`` (a LlamaConfig) at ``seq_length``; see the module docstring."""
    from llama import parameter_count

    n_matmul = parameter_count(llama) - llama.vocab_size * llama.hidden_size
    return 6.0 * n_matmul + 6.0 * llama.num_layers * seq_length * llama.num_attention_heads * llama.head_dim


@dataclass(frozen=True)
class Plan:
    world_size: int
    tensor: int
    pipeline: int
    context: int
    data: int
    micro_batch_size: int
    global_batch_size: int
    accumulation: int
    seq_length: int
    train_iters: int
    train_tokens: int | None
    parameters: int
    flops_per_token: float
    memory_bytes: dict
    checkpoint_bytes: int
    checkpoints_kept: int  # checkpoint.keep_last, 0 with checkpoint.save=false
    precision: dict

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_length


def layer_spec_of(cfg: TrainConfig) -> str:
    """``"transformer_engine"`` or ``"local"``: the layer spec a run of ``cfg`` builds
    (``LlamaConfig.builds_te_spec``, the rule ``llama.specs`` builds by), with Transformer Engine taken
    as available when its package is installed here (found, not imported: a dry run imports no
    megatron-core). The memory estimate depends on it (module docstring)."""
    te = importlib.util.find_spec("transformer_engine") is not None
    return "transformer_engine" if cfg.llama().builds_te_spec(te) else "local"


def _layer_params(m) -> int:
    h, d, f = m.hidden_size, m.head_dim, m.ffn_hidden_size
    return (
        h * (m.num_attention_heads + 2 * m.num_kv_heads) * d
        + m.num_attention_heads * d * h
        + 3 * h * f
        + 2 * h
    )


def make_plan(cfg: TrainConfig, world_size: int) -> Plan:
    """Resolve ``cfg`` at ``world_size`` GPUs (or processes).

    Raises:
        ValueError: an impossible combination, naming the numbers and what to change.
    """
    from llama import parameter_count

    par, tr = cfg.parallel, cfg.training
    m = cfg.llama()
    tp, pp, cp = par.tensor, par.pipeline, par.context
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if world_size % par.model_parallel_size:
        raise ValueError(
            f"world size {world_size} is not divisible by tensor*pipeline*context = "
            f"{tp}*{pp}*{cp} = {par.model_parallel_size}; change the parallel sizes or the GPU count"
        )
    dp = world_size // par.model_parallel_size
    if tr.global_batch_size % (tr.micro_batch_size * dp):
        raise ValueError(
            f"training.global_batch_size={tr.global_batch_size} is not divisible by micro_batch_size * "
            f"data_parallel = {tr.micro_batch_size} * {dp} = {tr.micro_batch_size * dp}; pick a global "
            "batch that is a multiple of it (or change the micro batch / parallel sizes)"
        )
    for name, value in (
        ("model.num_attention_heads", m.num_attention_heads),
        ("model.num_kv_heads", m.num_kv_heads),
        ("model.ffn_hidden_size", m.ffn_hidden_size),
        ("model.vocab_size", m.vocab_size),
    ):
        if value % tp:
            raise ValueError(
                f"{name}={value} is not divisible by parallel.tensor={tp}; choose a tensor-parallel "
                "size that divides it"
            )
    if m.num_layers % pp:
        raise ValueError(f"model.num_layers={m.num_layers} is not divisible by parallel.pipeline={pp}")
    if cp > 1 and cfg.data.seq_length % (2 * cp):
        raise ValueError(
            f"data.seq_length={cfg.data.seq_length} is not divisible by 2 * parallel.context = {2 * cp} "
            "(load-balanced context parallelism gives each rank two chunks)"
        )
    if par.sequence_parallel and cfg.data.seq_length % tp:
        raise ValueError(
            f"data.seq_length={cfg.data.seq_length} is not divisible by parallel.tensor={tp} "
            "(sequence parallelism splits the sequence)"
        )
    if cfg.projection.precision == "te_fp8" and (tr.micro_batch_size * cfg.data.seq_length // cp) % 16:
        raise ValueError(
            "projection.precision='te_fp8' needs micro_batch_size * seq_length / context to be a "
            "multiple of 16 (FP8 GEMM shapes)"
        )
    par.check_supported()  # the model's own limits (context parallelism: not in the attention)
    accumulation = tr.global_batch_size // (tr.micro_batch_size * dp)

    n = parameter_count(m)
    layers = m.num_layers // pp
    embed = m.vocab_size * m.hidden_size
    stage = [
        layers * _layer_params(m) + (embed if s == 0 else 0) + (embed + m.hidden_size if s == pp - 1 else 0)
        for s in range(pp)
    ]
    p_gpu = max(stage) / tp
    tokens_mb = tr.micro_batch_size * cfg.data.seq_length / cp
    h, d, f, hq, hkv = m.hidden_size, m.head_dim, m.ffn_hidden_size, m.num_attention_heads, m.num_kv_heads
    sp = tp if par.sequence_parallel else 1
    spec = layer_spec_of(cfg)
    per_token_layer = (
        2 * 4 * h / sp
        + (2 * ((2 * hq + 2 * hkv) * d + 3 * f) + 4 * hq) / tp
        + 2 * hq * d / tp  # the attention output twice: our core attention's, linear_proj's sbhd copy
        + (LOCAL_SPEC_EXTRA_H * h / sp if spec == "local" else 0)  # module docstring
    )
    proj = cfg.projection
    first, last = proj.fp8_bf16_first_layers, proj.fp8_bf16_last_layers
    # FP8 layers of the first stage (the most micro-batches in flight: the activations) and of the
    # stage with the most of them (the FP8 weight copies); the BF16 ends are on the first and last stage
    fp8_first_stage = max(0, layers - first - (last if pp == 1 else 0))
    fp8_most = max(0, layers - first - last if pp == 1 else (layers if pp > 2 else layers - min(first, last)))
    # TE FP8 saves the norm outputs and the SwiGLU output in FP8: 1 byte less each (module docstring)
    fp8_saved = (2 * h / sp + f / tp) if proj.precision == "te_fp8" else 0
    in_flight = min(pp, accumulation)
    activations = (
        per_token_layer * layers - fp8_saved * fp8_first_stage
    ) * tokens_mb * in_flight + 6 * m.vocab_size / tp * tokens_mb
    memory = {
        "weights": 2 * p_gpu,
        "gradients": 4 * p_gpu,
        "optimizer": 12 * p_gpu / dp,
        "activations": activations,
    }
    if proj.precision == "te_fp8":
        # Transformer Engine's FP8 copy of each projection weight, row- and column-wise, saved from
        # forward to backward (kept between steps too with projection.fp8_weight_cache); not in
        # the BF16 first/last layers; the norms' 2 * h per layer are not projections
        memory["fp8 weights"] = 2 * fp8_most * (_layer_params(m) - 2 * h) / tp
    memory["total"] = sum(memory.values())
    projection = (
        "bf16"
        if proj.precision == "bf16"
        else (
            f"te_fp8 (format {proj.fp8_format}, {proj.fp8_scaling} scaling, BF16 first/last layers "
            f"{proj.fp8_bf16_first_layers}/{proj.fp8_bf16_last_layers}, FP8 weight cache "
            f"{'on' if proj.fp8_weight_cache else 'off'})"
        )
    )
    return Plan(
        world_size=world_size,
        tensor=tp,
        pipeline=pp,
        context=cp,
        data=dp,
        micro_batch_size=tr.micro_batch_size,
        global_batch_size=tr.global_batch_size,
        accumulation=accumulation,
        seq_length=cfg.data.seq_length,
        train_iters=cfg.train_iters,
        train_tokens=tr.train_tokens,
        parameters=n,
        flops_per_token=flops_per_token(m, cfg.data.seq_length),
        memory_bytes=memory,
        checkpoint_bytes=14 * n,
        checkpoints_kept=cfg.checkpoint.keep_last if cfg.checkpoint.save else 0,
        precision={
            "attention": f"{cfg.attention.get_recipe().label} (backend {cfg.attention.backend})",
            "projection": projection,
            "layer spec": f"{spec.replace('_', ' ')} layer spec"
            + (
                " (transformer_impl auto and no Transformer Engine installed here; "
                "model.transformer_impl=transformer_engine estimates the TE spec)"
                if spec == "local" and m.transformer_impl == "auto"
                else ""
            ),
        },
    )


def format_plan(plan: Plan) -> str:
    """The plan as aligned text lines; only the lines starting with ``precision`` depend on precision."""
    rows = _plan_rows(plan)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _checkpoint_text(plan: Plan) -> str:
    each = f"{plan.checkpoint_bytes / GIB:.2f} GiB each (BF16 model + FP32 main weights + Adam m, v)"
    k = plan.checkpoints_kept
    if not k:
        return f"{each}; none written (checkpoint.save=false)"
    return (
        f"{each}; checkpoint.keep_last {k}: {k * plan.checkpoint_bytes / GIB:.2f} GiB on disk, "
        f"{(k + 1) * plan.checkpoint_bytes / GIB:.2f} GiB while the next one is written"
    )


def _plan_rows(plan: Plan) -> list[tuple[str, str]]:
    tps = plan.tokens_per_step
    total_tokens = plan.train_iters * tps
    if plan.train_tokens is not None:
        exact = plan.train_tokens / tps
        rounding = (
            "exact"
            if plan.train_tokens % tps == 0
            else f"rounded up: the last step completes the budget, overshooting by "
            f"{total_tokens - plan.train_tokens:,} tokens"
        )
        steps = (
            f"{plan.train_iters:,} (train_tokens {plan.train_tokens:,} / {tps:,} tokens per step = "
            f"{exact:,.2f}; {rounding})"
        )
    else:
        steps = f"{plan.train_iters:,} (training.train_iters)"
    mem = plan.memory_bytes
    rows = [
        (
            "world size",
            f"{plan.world_size} = DP {plan.data} x TP {plan.tensor} x PP {plan.pipeline} x CP {plan.context}",
        ),
        ("parallel", f"DP {plan.data}, TP {plan.tensor}, PP {plan.pipeline}, CP {plan.context}"),
        ("micro batch", f"{plan.micro_batch_size} sequences x {plan.seq_length} tokens"),
        ("global batch", f"{plan.global_batch_size} sequences = {tps:,} tokens per step"),
        (
            "accumulation",
            (
                f"{plan.accumulation} micro-batches per step per DP rank "
                f"(global {plan.global_batch_size} / (micro {plan.micro_batch_size} x DP {plan.data}))"
            ),
        ),
        ("steps", steps),
        ("tokens", f"{total_tokens:,}"),
        ("parameters", f"{plan.parameters:,}"),
        ("flops/token", f"{plan.flops_per_token:.4e} (6*N_matmul + 6*L*s*Hq*d)"),
        (
            "memory/GPU",
            (
                f"weights {mem['weights'] / GIB:.2f} GiB (BF16) + gradients {mem['gradients'] / GIB:.2f} "
                f"GiB (FP32) + optimizer {mem['optimizer'] / GIB:.2f} GiB (FP32 main+m+v / DP)"
            ),
        ),
        (
            "activations/GPU",
            (
                f"{mem['activations'] / GIB:.2f} GiB (estimate, no recomputation, "
                f"{plan.precision['layer spec']})"
            ),
        ),
        *(
            [("FP8 weights/GPU", f"{mem['fp8 weights'] / GIB:.2f} GiB (TE's FP8 projection weights)")]
            if "fp8 weights" in mem
            else []
        ),
        ("total/GPU", f"{mem['total'] / GIB:.2f} GiB (estimate)"),
        ("checkpoint", _checkpoint_text(plan)),
        ("precision attention", plan.precision["attention"]),
        ("precision projection", plan.precision["projection"]),
    ]
    return rows


@dataclass(frozen=True)
class Estimate:
    """Wall clock and GPU-hours of a plan's training steps (no start-up, validation or saves)."""

    flops: float  # training FLOPs: steps x tokens per step x flops_per_token
    seconds: float  # wall clock
    gpu_hours: float
    mfu: float  # the assumed MFU (fraction)
    peak_flops_per_gpu: float  # FLOP/s


def estimate_time(plan: Plan, *, peak_flops_per_gpu: float, mfu: float = ASSUMED_MFU) -> Estimate:
    """Wall clock of ``plan`` on ``plan.world_size`` GPUs at ``mfu`` of ``peak_flops_per_gpu``.

    Raises:
        ValueError: ``mfu`` not in (0, 1] or a peak <= 0.
    """
    if not 0.0 < mfu <= 1.0:
        raise ValueError(f"the assumed MFU must be in (0, 1], got {mfu}")
    if not peak_flops_per_gpu > 0:
        raise ValueError(f"the peak FLOP/s per GPU must be > 0, got {peak_flops_per_gpu}")
    flops = plan.train_iters * plan.tokens_per_step * plan.flops_per_token
    seconds = flops / (plan.world_size * mfu * peak_flops_per_gpu)
    return Estimate(flops, seconds, seconds * plan.world_size / 3600.0, mfu, peak_flops_per_gpu)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:,.1f} h ({seconds / 86400:,.1f} days)"


def _gpu_hours(h: float) -> str:
    return f"{h:,.1f}" if h >= 1 else f"{h:.2g}"


def memory_verdict(total_bytes: float, gpu_memory_bytes: float) -> str:
    """How an estimate of ``total_bytes`` per GPU sits in ``gpu_memory_bytes``, against the memory the
    estimate leaves out (:data:`UNCOUNTED_GIB`, the CUDA context and PyTorch's cached blocks in the H200
    runs): ``"fits"`` (it leaves at least the largest reserve measured), ``"at the edge"`` (at least the
    smallest), ``"short of the reserve"`` (less than the smallest) or ``"does not fit"`` (it exceeds
    the memory). The one rule of the dry run's check and of the out-of-memory advice."""
    left = gpu_memory_bytes - total_bytes
    lo, hi = UNCOUNTED_GIB
    if left < 0:
        return "does not fit"
    if left < lo * GIB:
        return "short of the reserve"
    return "at the edge" if left < hi * GIB else "fits"


def format_estimate(
    plan: Plan, est: Estimate, *, gpu_memory_bytes: float, gpu_name: str
) -> tuple[list[str], list[str]]:
    """The time estimate and the memory check as ``(lines, warnings)``: lines in the layout of
    :func:`format_plan`; one warning when the memory estimate per GPU exceeds ``gpu_memory_bytes``
    (the memory of ``gpu_name``, e.g. ``an H200``), or leaves less of it than the largest reserve
    (:data:`UNCOUNTED_GIB`) measured beyond the peak allocation: "DOES NOT FIT with the reserve"
    below the smallest reserve, "AT THE EDGE" below the largest."""
    tokens = plan.train_iters * plan.tokens_per_step
    gpus = f"{plan.world_size} GPU{'s' if plan.world_size > 1 else ''}"
    total = plan.memory_bytes["total"]
    mem = f"{total / GIB:.2f} GiB estimated per GPU, of the {gpu_memory_bytes / GIB:.1f} GiB of {gpu_name}"
    warnings = []
    left = gpu_memory_bytes - total
    lo, hi = UNCOUNTED_GIB
    remedy = MEMORY_REMEDY
    verdict = memory_verdict(total, gpu_memory_bytes)
    if verdict == "does not fit":
        mem += ": DOES NOT FIT"
        warnings.append(
            f"the memory estimate per GPU, {total / GIB:.2f} GiB, exceeds the "
            f"{gpu_memory_bytes / GIB:.1f} GiB of {gpu_name}: {NO_FIT_REMEDY}"
        )
    elif verdict != "fits":
        seen = (
            "the CUDA context and PyTorch's cached blocks took beyond the peak allocation in the H200 runs "
            "this estimate was checked against (results/train_throughput_h200.json, results/te_h200/)"
        )
        if verdict == "short of the reserve":
            mem += f": DOES NOT FIT with the reserve, {left / GIB:.2f} GiB left"
            why = f"less than the {lo} GiB that {seen}, in every one of them: "
            why += f"an out-of-memory error is likely; {remedy}"
        else:
            mem += f": AT THE EDGE, {left / GIB:.2f} GiB left"
            why = (
                f"within the {lo}-{hi} GiB that {seen}. The allocator frees cached blocks before it "
                "fails, so the run may fit, but fragmentation can end it with an out-of-memory error: "
                f"watch the first steps' memory in the log; to leave more room, {remedy}"
            )
        warnings.append(
            f"the memory estimate per GPU, {total / GIB:.2f} GiB, leaves {left / GIB:.2f} GiB of the "
            f"{gpu_memory_bytes / GIB:.1f} GiB of {gpu_name}, {why}"
        )
    else:
        mem += f": fits, {left / GIB:.2f} GiB left"
    mem += f" (the CUDA context and allocator reserve are not in it: {lo}-{hi} GiB on the H200)"
    rows = [
        (
            "time estimate",
            f"{_duration(est.seconds)} wall clock on {gpus} = {_gpu_hours(est.gpu_hours)} GPU-hours "
            "(training steps only)",
        ),
        (
            "time assumption",
            f"{tokens:,} tokens x {plan.flops_per_token:.4e} FLOPs/token = {est.flops:.3e} FLOPs, assuming "
            f"{100 * est.mfu:.0f}% MFU (--mfu) of {est.peak_flops_per_gpu / 1e12:.1f} TFLOP/s per GPU "
            "(logging.peak_flops_per_gpu; 989.4 = H100/H200 dense BF16); measured on one H200: 44.0% "
            "bf16, 39.7-41.1% low-precision attention (results/train_throughput_h200.md)",
        ),
        ("memory check", mem),
    ]
    width = max(len(k) for k, _ in _plan_rows(plan))
    return [f"{k:<{width}}  {v}" for k, v in rows], warnings


def smaller_micro_batch(
    cfg: TrainConfig, world_size: int, gpu_memory_bytes: float | None = None
) -> tuple[int, Plan, str] | None:
    """A ``training.micro_batch_size`` below ``cfg``'s that makes a valid plan at ``world_size`` (it
    divides the global batch per data-parallel rank, and the FP8 projections' shape rule holds):
    ``(micro-batch, its plan, verdict)``, or None at micro-batch 1 or when none qualifies.

    Without ``gpu_memory_bytes`` the largest valid one (verdict ``""``). With it, the largest whose
    estimate leaves at least the largest reserve measured beyond the peak allocation
    (:data:`UNCOUNTED_GIB`, verdict ``"fits"``), else the largest that leaves at least the smallest
    (``"at the edge"``), by :func:`memory_verdict`; None if none leaves that.

    The global batch is unchanged: the samples of every step and the optimizer steps are the same,
    only the gradient accumulation grows (the sums are reordered, so the losses are not bitwise those
    of the larger micro-batch)."""
    import dataclasses

    edge = None
    for mb in range(cfg.training.micro_batch_size - 1, 0, -1):
        try:  # the training section's own check, then the plan's
            smaller = cfg.replace(training=dataclasses.replace(cfg.training, micro_batch_size=mb))
            plan = make_plan(smaller, world_size)
        except ValueError:
            continue
        if gpu_memory_bytes is None:
            return mb, plan, ""
        verdict = memory_verdict(plan.memory_bytes["total"], gpu_memory_bytes)
        if verdict == "fits":
            return mb, plan, verdict
        if verdict == "at the edge" and edge is None:
            edge = (mb, plan, verdict)
    return edge


def out_of_memory_text(
    cfg: TrainConfig,
    plan: Plan,
    *,
    where: str,
    error: BaseException,
    peak_gib: float | None,
    activations: bool,
    gpu_memory_bytes: float | None = None,
    expandable_segments: bool = False,
) -> str:
    """What ``pretrain_llama.py`` says when a run stops on ``torch.OutOfMemoryError``: where
    (``where``, e.g. ``"in step 7"``), the error's first line, the plan's memory estimate per GPU and
    the peak allocation seen before the error (``peak_gib``, None if unknown), and what to change.

    When the estimate leaves at least the smallest measured reserve of ``gpu_memory_bytes``
    (:data:`UNCOUNTED_GIB`) and ``expandable_segments`` (``PYTORCH_CUDA_ALLOC_CONF`` holds
    ``expandable_segments:True``) is off, the advice leads with that setting: fragmentation is then
    the likely cause, and the setting changes nothing else of the run (measured on an H100:
    ``configs/small_gpu.yaml`` at micro-batch 64, estimate 62.41 GiB, ran out with 31.4 GiB reserved
    but unallocated, and with the setting peaked at 59.7 GiB; results/session_2026-12-05h_cpu/).
    ``activations``: the error came in a step or a validation, where a smaller micro-batch helps; the
    advice then names :func:`smaller_micro_batch` (checked against the GPU's memory when given), its
    estimate and the overrides a resume needs (the micro-batch size is part of the checked config:
    ``checkpoint.allow_config_change``). At start-up or in a save only :data:`OTHER_MEMORY_REMEDY`
    applies."""
    lines = str(error).strip().splitlines()
    first = lines[0] if lines else type(error).__name__
    text = f"out of GPU memory {where} ({first})"
    total = plan.memory_bytes["total"]
    text += f"; the plan's estimate is {total / GIB:.2f} GiB per GPU"
    if peak_gib is not None:
        text += f", the peak allocation of this launch before the error {peak_gib:.2f} GiB"
    if gpu_memory_bytes is not None:
        text += f", of the GPU's {gpu_memory_bytes / GIB:.1f} GiB"
    text += " (pretrain_llama.py --dry-run checks the estimate against the GPU's memory). To fit: "
    verdict = None if gpu_memory_bytes is None else memory_verdict(total, gpu_memory_bytes)
    if verdict in ("fits", "at the edge") and not expandable_segments:
        text += (
            "the estimate fits this GPU, so fragmentation (memory PyTorch reserved but cannot reuse) is "
            "the likely cause: relaunch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True first, "
            "which changes nothing else of the run; if that is not enough, "
        )
    if not activations or plan.micro_batch_size == 1:
        return text + OTHER_MEMORY_REMEDY
    smaller = smaller_micro_batch(cfg, plan.world_size, gpu_memory_bytes)
    if smaller is None:
        return (
            text + f"no smaller training.micro_batch_size fits by the plan's estimate; {OTHER_MEMORY_REMEDY}"
        )
    mb, plan2, verdict = smaller
    return text + (
        f"training.micro_batch_size={mb} (estimated {plan2.memory_bytes['total'] / GIB:.2f} GiB per GPU"
        + (f", {verdict}" if verdict else "")
        + f"; the same samples in every step, gradient accumulation {plan.accumulation} -> "
        f"{plan2.accumulation}, sums reordered so not bitwise the old losses): relaunch with "
        f"training.micro_batch_size={mb} 'checkpoint.allow_config_change=[training.micro_batch_size]' "
        f"(added to any list you pass already); or {OTHER_MEMORY_REMEDY}"
    )


# Tokens above which a run on the embedded default corpus (the KJV and CPython's sources, about 9M
# Llama-3 tokens: data/corpus.py) repeats it more than about ten times: the dry run says so and a
# training run refuses to start (check_corpus)
DEFAULT_CORPUS_WARN_TOKENS = 100_000_000


def missing_data_warnings(cfg: TrainConfig) -> list[str]:
    """The dry run's warnings for ``data.corpus`` prefixes whose ``.idx`` or ``.bin`` file does not
    exist on this machine (found by a new-user review: a Slurm user's pre-flight check passed a path
    the job then failed on). Warnings, not errors: the dry run needs no data, and a login node may
    not mount the compute nodes' file systems."""
    if cfg.data.corpus == "default":
        return []
    from data.indexed import bin_path, idx_path

    out = []
    for entry in cfg.data.corpus:
        prefix = entry["prefix"]
        missing = [f for f in (idx_path(prefix), bin_path(prefix)) if not os.path.isfile(f)]
        if missing:
            out.append(
                f"data.corpus prefix {prefix}: {' and '.join(missing)} not found on this machine; the job "
                f"stops at start-up without them (prepare them: python -m data.prepare --input FILES "
                f"--output-prefix {prefix}; or, where this machine does not mount the compute nodes' file "
                "systems, check the path there)"
            )
    return out


def corpus_warning(cfg: TrainConfig, plan: Plan) -> str | None:
    """The dry run's warning for a run of more than :data:`DEFAULT_CORPUS_WARN_TOKENS` tokens on
    ``data.corpus: default`` (the embedded sample corpus, which the 8B configs name until a real blend
    replaces it), else None; a training run refuses it (:func:`check_corpus`). The start-up log gives
    the exact number of passes of a shorter run (``training.data_setup.build_data``)."""
    tokens = plan.train_iters * plan.tokens_per_step
    if cfg.data.corpus != "default" or tokens <= DEFAULT_CORPUS_WARN_TOKENS:
        return None
    return (
        f"data.corpus is 'default', the embedded sample corpus (about 9M tokens, data/corpus.py): "
        f"{tokens:,} training tokens would repeat it about {tokens / 9e6:,.0f} times, which a training "
        "run refuses. For pretraining, prepare your corpus (python -m data.prepare --input FILES "
        "--output-prefix PREFIX) and set data.corpus=[{prefix: PREFIX, weight: 1.0}] data.split=969,30,1 "
        "(README, Your data)"
    )


def check_corpus(cfg: TrainConfig, plan: Plan) -> None:
    """Refuse a training run that would repeat the embedded sample corpus more than about ten times
    (:func:`corpus_warning`), before anything is built or written.

    Raises:
        ValueError: the warning's text, naming ``data.corpus`` and how to prepare a corpus (found in
            review, 2026-12-06: the README's 64-GPU launch of an 8B config, which names the sample
            corpus until a blend replaces it, would have trained 53 h on ~11,000 passes of it, with a
            warning in the log).
    """
    if (text := corpus_warning(cfg, plan)) is not None:
        raise ValueError(text)
