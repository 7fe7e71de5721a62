"""The runs of the throughput benchmark: what each one trains, in which order, and whether it fits.

Every (arm, micro-batch) is its own ``pretrain_llama.py`` process (clean GPU memory), run one after
the other (never two at once; the embedded corpus is prepared once, before the first): the 8B recipe
``configs/llama3_1_8b_100b_bf16.yaml`` with ``model.num_layers=L`` (default 12; hidden 4096, 32/8
heads, head dim 128, FFN 14336, vocab 128256 as in ``model.preset=llama3_1_8b``), sequence 4096,
micro-batch 1, 2, 4 with global batch = micro-batch (no accumulation; ``--accumulation K``: K
micro-batches per step, as the 8B recipe's 4 at 64 GPUs), the embedded corpus,
validation, telemetry and TensorBoard off, a log line per step, ``checkpoint.save=false`` (an 8B-shaped
checkpoint would take ~70 GB and minutes) and ``train_iters`` = warm-up + timed steps (3 + 6).

Arms, in this order, each an attention recipe on its backend with a projection precision:

| arm | projections | attention |
|---|---|---|
| ``bf16`` (the baseline) | Transformer Engine BF16 | ``bf16`` on ``fa4`` (flash-attn-4) |
| ``fp8-attn`` | Transformer Engine BF16 | ``fp8`` on ``cute`` |
| ``te-fp8`` | Transformer Engine FP8 | ``bf16`` on ``fa4`` |
| ``te-fp8+fp8-attn`` | Transformer Engine FP8 | ``fp8`` on ``cute`` |
| ``te-fp8+nvfp4qk_fp8pv`` | Transformer Engine FP8 | ``nvfp4qk_fp8pv`` on ``cute`` (1) |

(1) its CuTe backward recomputes S^T as a BF16 wgmma on the NVFP4 decodes (results/cute_nvfp4_bwd_h200).

(``model.transformer_impl=transformer_engine``: megatron-core's TE layer spec, which a user of the
BF16 stack runs; ``projection.precision=bf16`` or ``te_fp8``, the latter with the rest of the
projection section of ``configs/llama3_1_8b_100b_fp8.yaml``: :func:`fp8_projection_overrides`.)
The backend of each recipe is its fastest on the H200 (:data:`FASTEST_BACKEND`);
``--backend-override RECIPE=BACKEND`` changes it for every arm of that recipe. Opt-in arms with
megatron-core's local projections
(``model.transformer_impl=local``, no Transformer Engine): ``local-bf16``, ``local-bf16+fp8-attn``,
``local-bf16+nvfp4qk_fp8pv``; ``results/train_throughput_h200.md`` was measured with these (named
``bf16``, ``fp8``, ``nvfp4qk_fp8pv`` then) on ``triton`` (``--backend-override bf16=triton
fp8=triton nvfp4qk_fp8pv=triton``). Every ratio is against the ``bf16`` arm (``local-bf16`` when
only local arms run: :func:`baseline_arm`), which is always run.

Memory on one GPU (why L = 12): the distributed optimizer on one rank keeps 18 bytes per parameter
(BF16 weight 2 + FP32 gradient 4 + FP32 main weight 4 + Adam m, v 8), parameters = 1.05B (the two
128256 x 4096 embedding tables) + 0.218B per layer; activations ~2.3 GB per layer at micro-batch
4 x 4096 (``training/plan.py``'s estimate, no recomputation) and ~20 GB for the logits and the
cross-entropy over 128256 classes. L = 12: 3.67B x 18 = 66 GB + 27 GB + 20 GB ~ 114 GB fits in the
H200's 141 GB; L = 16: 82 + 37 + 20 ~ 139 GB does not leave room for the allocator.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import REPO

BASE_CONFIG = "configs/llama3_1_8b_100b_bf16.yaml"
# The Transformer Engine FP8 arms take every projection setting (format, scaling, BF16 layers, FP8
# weight cache) from the 8B low-precision recipe, so that they time what that recipe trains
FP8_CONFIG = "configs/llama3_1_8b_100b_fp8.yaml"
# The fastest backend of each recipe, forward + backward at B4 H32/8 S4096 causal on the H200: bf16 on
# FA4 3.86 ms (cuDNN 4.23), fp8 on cute 4.86 ms (triton 9.83; results/cute_unpromoted_h200);
# nvfp4qk_fp8pv on cute 4.580 ms with its CuTe backward (triton 11.133; results/cute_nvfp4_bwd_h200),
# which auto picks too.
FASTEST_BACKEND = {"bf16": "fa4", "fp8": "cute", "nvfp4qk_fp8pv": "cute"}


@dataclass(frozen=True)
class Arm:
    """What one arm trains: the attention recipe, the projection precision and the layer spec
    (``model.transformer_impl``: ``transformer_engine`` or ``local``)."""

    recipe: str
    projection: str
    transformer_impl: str = "transformer_engine"

    @property
    def low_precision(self) -> bool:
        return self.recipe != "bf16" or self.projection != "bf16"


# the default arms, in the order of the tables
ARMS = {
    "bf16": Arm("bf16", "bf16"),
    "fp8-attn": Arm("fp8", "bf16"),
    "te-fp8": Arm("bf16", "te_fp8"),
    "te-fp8+fp8-attn": Arm("fp8", "te_fp8"),
    "te-fp8+nvfp4qk_fp8pv": Arm("nvfp4qk_fp8pv", "te_fp8"),
}
# opt-in: megatron-core's local projections, no Transformer Engine
LOCAL_ARMS = {
    "local-bf16": Arm("bf16", "bf16", "local"),
    "local-bf16+fp8-attn": Arm("fp8", "bf16", "local"),
    "local-bf16+nvfp4qk_fp8pv": Arm("nvfp4qk_fp8pv", "bf16", "local"),
}
ALL_ARMS = {**ARMS, **LOCAL_ARMS}
BASELINE = "bf16"
LOCAL_BASELINE = "local-bf16"
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
    accumulation: int = 1  # micro-batches per step (global batch = accumulation x micro-batch)

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
    backends: dict[str, str] | None = None,
    extra: list[str] = (),
    accumulation: int = 1,
) -> list[str]:
    """The ``section.key=value`` overrides of one run on top of :data:`BASE_CONFIG` (``extra`` last, so
    it wins).

    Args:
        backends: recipe -> attention backend (default :data:`FASTEST_BACKEND`).
        accumulation: micro-batches per step: global batch = ``accumulation * micro_batch``.
    Raises:
        KeyError: an arm that is not in :data:`ALL_ARMS`, or a recipe without a backend.
    """
    a = ALL_ARMS[arm]
    backend = (FASTEST_BACKEND if backends is None else backends)[a.recipe]
    return [
        f"model.num_layers={layers}",
        f"model.transformer_impl={a.transformer_impl}",
        f"attention.recipe={a.recipe}",
        f"attention.backend={backend}",
        f"projection.precision={a.projection}",
        *(fp8_projection_overrides() if a.projection == "te_fp8" else []),
        "data.corpus=default",
        f"data.seq_length={seq}",
        f"training.micro_batch_size={micro_batch}",
        f"training.global_batch_size={accumulation * micro_batch}",
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


def fp8_projection_overrides() -> list[str]:
    """The ``projection.*`` overrides (all but ``precision``) of :data:`FP8_CONFIG`'s projection section.

    Raises:
        ValueError: :data:`FP8_CONFIG` does not validate or its projection is not ``te_fp8``.
    """
    import dataclasses

    from training.config import load_config

    proj = load_config(REPO / FP8_CONFIG).projection
    if proj.precision != "te_fp8":
        raise ValueError(f"{FP8_CONFIG}: projection.precision={proj.precision!r}, expected te_fp8")
    return [
        f"projection.{f.name}={getattr(proj, f.name)}"
        for f in dataclasses.fields(proj)
        if f.name != "precision"
    ]


def baseline_arm(arms) -> str:
    """The arm every ratio is against: ``bf16``, or ``local-bf16`` when every arm is a local one."""
    return LOCAL_BASELINE if arms and all(a in LOCAL_ARMS for a in arms) else BASELINE


def with_baseline(arms: list[str]) -> list[str]:
    """``arms`` in the order of :data:`ALL_ARMS`, its baseline (:func:`baseline_arm`) added if missing."""
    chosen = {*arms, baseline_arm(arms)}
    return [a for a in ALL_ARMS if a in chosen]


def backend_table(overrides: list[str]) -> dict[str, str]:
    """:data:`FASTEST_BACKEND` with ``RECIPE=BACKEND`` overrides applied.

    Raises:
        ValueError: an override that is not ``RECIPE=BACKEND`` with a recipe of the table (whether
            the backend runs the recipe is checked with the run configs: :func:`validate_runs`).
    """
    table = dict(FASTEST_BACKEND)
    for item in overrides:
        recipe, eq, backend = item.partition("=")
        if not eq or recipe not in table or not backend:
            raise ValueError(
                f"--backend-override {item!r}: expected RECIPE=BACKEND with RECIPE one of "
                f"{', '.join(table)} (e.g. fp8=triton)"
            )
        table[recipe] = backend
    return table


def plan_runs(args) -> list[RunSpec]:
    """The runs, most important first (a benchmark cut short by its time limit keeps those): the main
    runs at the largest micro-batch (the throughput targets), the extrapolation runs (same micro-batch,
    L2 layers), then the main runs at the other micro-batches, largest first; arms in ``args.arms``'
    order. ``args.backends``: recipe -> backend (default :data:`FASTEST_BACKEND`)."""
    specs = []
    backends = getattr(args, "backends", None)
    accumulation = getattr(args, "accumulation", 1)

    def add(arm, mb, layers, purpose):
        out = Path(args.run_dir) / f"{arm}_mb{mb}_L{layers}"
        overrides = run_overrides(
            arm,
            mb,
            layers,
            seq=args.seq,
            train_iters=args.warmup + args.timed,
            output_dir=out,
            backends=backends,
            extra=args.override,
            accumulation=accumulation,
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
                accumulation=accumulation,
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
        if cfg.checkpoint.save or plan.accumulation != spec.accumulation:
            raise ValueError(
                f"run {spec.name}: expected checkpoint.save=false and {spec.accumulation} micro-batch(es) "
                f"per step, got checkpoint.save={cfg.checkpoint.save} and {plan.accumulation}"
            )
        spec.plan = {
            "flops_per_token": plan.flops_per_token,
            "peak_flops_per_gpu": cfg.logging.peak_flops_per_gpu,
            "tokens_per_step": plan.tokens_per_step,
            "parameters": plan.parameters,
            "memory_estimate_gib": plan.memory_bytes["total"] / GIB,
            "seq_length": plan.seq_length,
            "train_iters": plan.train_iters,
            "recipe": cfg.attention.recipe,
            "backend": cfg.attention.backend,
            "projection": cfg.projection.precision,
            "transformer_impl": model.transformer_impl,
            "default_corpus": cfg.data.corpus == "default",
            "data_cache_dir": cfg.data.cache_dir,
            "model": {"preset": cfg.model.preset, **{k: getattr(model, k) for k in MODEL_KEYS}},
        }
