"""The runs of the throughput benchmark: what each one trains, in which order, and whether it fits.

Every (arm, micro-batch) is its own ``pretrain_llama.py`` process (clean GPU memory), run one after
the other (never two at once; the embedded corpus is prepared once, before the first): the 8B recipe
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
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import REPO
from .process import child_env

BASE_CONFIG = "configs/llama3_1_8b_100b_bf16.yaml"
ARMS = {"bf16": ("bf16", "bf16"), "fp8": ("fp8", "bf16"), "nvfp4qk_fp8pv": ("nvfp4qk_fp8pv", "bf16")}
TE_ARMS = {"bf16+te_fp8": ("bf16", "te_fp8"), "nvfp4qk_fp8pv+te_fp8": ("nvfp4qk_fp8pv", "te_fp8")}
BASELINE = "bf16"
GIB = 1024**3
MODEL_KEYS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "ffn_hidden_size",
    "vocab_size",
)


@dataclass
class RunSpec:
    """One ``pretrain_llama.py`` process: an arm at a micro-batch and a layer count."""

    arm: str
    micro_batch: int
    layers: int
    purpose: str  # "main" or "extrapolation"
    output_dir: Path
    overrides: list[str]
    argv: list[str]
    plan: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.arm}_mb{self.micro_batch}_L{self.layers}"


def run_overrides(
    arm: str,
    micro_batch: int,
    layers: int,
    *,
    seq: int,
    train_iters: int,
    output_dir: Path,
    extra: list[str] = (),
) -> list[str]:
    """The ``section.key=value`` overrides of one run on top of :data:`BASE_CONFIG` (``extra`` last, so
    it wins).

    Raises:
        KeyError: an arm that is neither in :data:`ARMS` nor in :data:`TE_ARMS`.
    """
    recipe, projection = {**ARMS, **TE_ARMS}[arm]
    return [
        f"model.num_layers={layers}",
        f"attention.recipe={recipe}",
        "attention.backend=triton",
        f"projection.precision={projection}",
        "data.corpus=default",
        f"data.seq_length={seq}",
        f"training.micro_batch_size={micro_batch}",
        f"training.global_batch_size={micro_batch}",
        "training.train_tokens=null",
        f"training.train_iters={train_iters}",
        "training.warmup_iters=1",
        "validation.interval=0",
        "validation.iters=0",
        "logging.telemetry_interval=0",
        "logging.tensorboard=false",
        "logging.log_interval=1",
        "logging.progress_bar=false",
        "logging.wandb_mode=disabled",
        "checkpoint.save=false",
        "checkpoint.load=none",
        "runtime.exit_duration_mins=null",
        f"runtime.output_dir={output_dir}",
        *extra,
    ]


def plan_runs(args) -> list[RunSpec]:
    """The runs, most important first (a benchmark cut short by its time limit keeps those): the main
    runs at the largest micro-batch (the throughput targets), the extrapolation runs (same micro-batch,
    L2 layers), then the main runs at the other micro-batches, largest first; arms in order, bf16 first."""
    specs = []

    def add(arm, mb, layers, purpose):
        out = Path(args.run_dir) / f"{arm}_mb{mb}_L{layers}"
        overrides = run_overrides(
            arm,
            mb,
            layers,
            seq=args.seq,
            train_iters=args.warmup + args.timed,
            output_dir=out,
            extra=args.override,
        )
        argv = [
            sys.executable,
            str(REPO / "pretrain_llama.py"),
            "--config",
            str(REPO / args.config),
            *overrides,
        ]
        specs.append(
            RunSpec(
                arm=arm,
                micro_batch=mb,
                layers=layers,
                purpose=purpose,
                output_dir=out,
                overrides=overrides,
                argv=argv,
            )
        )

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
            model = cfg.llama()
        except (ValueError, FileNotFoundError) as err:
            raise ValueError(f"run {spec.name}: {err}") from None
        if cfg.checkpoint.save or plan.accumulation != 1:
            raise ValueError(f"run {spec.name}: expected checkpoint.save=false and no accumulation")
        spec.plan = {
            "flops_per_token": plan.flops_per_token,
            "peak_flops_per_gpu": cfg.logging.peak_flops_per_gpu,
            "tokens_per_step": plan.tokens_per_step,
            "parameters": plan.parameters,
            "memory_estimate_gib": plan.memory_bytes["total"] / GIB,
            "seq_length": plan.seq_length,
            "train_iters": plan.train_iters,
            "recipe": cfg.attention.recipe,
            "projection": cfg.projection.precision,
            "default_corpus": cfg.data.corpus == "default",
            "data_cache_dir": cfg.data.cache_dir,
            "model": {"preset": cfg.model.preset, **{k: getattr(model, k) for k in MODEL_KEYS}},
        }


def transformer_engine_status() -> tuple[bool, str]:
    """(usable, a sentence for the output): whether ``import transformer_engine.pytorch`` works (in a
    child process)."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False, (
            "Transformer Engine is not installed on this machine (`import transformer_engine` "
            "fails: No module named 'transformer_engine'): no FP8 (TE) projection arms; every arm "
            "uses BF16 projections"
        )
    try:
        code = "import transformer_engine as t, transformer_engine.pytorch; print(t.__version__)"
        res = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=300,
            env=child_env(),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, (
            "Transformer Engine: `import transformer_engine.pytorch` timed out: no FP8 (TE) projection arms"
        )
    if res.returncode != 0:
        err = (res.stderr.strip().splitlines() or ["?"])[-1][:200]
        return False, (
            f"Transformer Engine does not import on this machine ({err}): no FP8 (TE) projection "
            "arms; every arm uses BF16 projections"
        )
    return True, (
        f"Transformer Engine {res.stdout.strip()} imports: FP8 (TE) projection arms "
        f"{', '.join(TE_ARMS)} added"
    )
