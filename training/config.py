"""The training job's configuration: YAML sections validated into keyword-only dataclasses.

    cfg = load_config("configs/default.yaml", ["training.train_iters=50", "attention.recipe=bf16"])
    cfg = load_config(None)                     # the embedded default (same as configs/default.yaml)

Sections (each a dataclass: below, or the model's and the attention's own config types; its
``__post_init__`` raises ``ValueError`` saying how to fix a value; an unknown section or key is an
error that lists the valid ones):

| section | holds |
|---|---|
| ``model`` | ``preset`` + overrides of any :class:`llama.LlamaConfig` field (shapes, init_std, ...) |
| ``attention`` | :class:`fp4_attention.AttentionConfig`: recipe, backend, options, qk_rotation, fuse_rope |
| ``projection`` | :class:`llama.ProjectionConfig`: ``precision`` (bf16, te_fp8 here) and the TE FP8 fields |
| ``parallel`` | :class:`llama.ParallelConfig`: ``tensor``, ``pipeline``, ``context``, ``sequence_parallel`` |
| ``data`` | ``corpus`` (``default`` or a list of ``{prefix, weight}``), tokenizer, seq_length, split, seed |
| ``training`` | batch sizes, ``train_tokens`` or ``train_iters``, AdamW, LR schedule, clipping, init seed |
| ``checkpoint`` | dir, save (false: never), save_interval, keep_last, async_save, load, allow_config_change |
| ``logging`` | log_interval, metrics_file, tensorboard, wandb, telemetry_interval, peak FLOP/s for MFU |
| ``validation`` | interval, iters |
| ``runtime`` | exit_duration_mins, nonfinite (skip, stop), deterministic, output_dir |

Command-line overrides are dotted ``section.key=value``; the value is parsed with
``yaml.safe_load``. Numbers given as strings (YAML 1.1 reads ``3e-4`` as a string) are accepted
for numeric fields, so ``training.lr=3e-4`` works.

The *resolved* config (``training.resolved.resolved_dict``) is the validated config as a plain dict with every
model field spelled out, ``training.train_iters`` computed from ``train_tokens``, and (once the
trainer has resolved it) ``attention.backend`` naming the backend that runs; it is saved with the run
and in every checkpoint, and compared on resume (``training.checkpoint``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fp4_attention import TRAINING_RECIPES, AttentionConfig
from llama import PRESETS, LlamaConfig, ParallelConfig, ProjectionConfig, preset

__all__ = [
    "CONFIG_SECTIONS",
    "TrainConfig",
    "apply_overrides",
    "from_dict",
    "load_config",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG_PATH = REPO_ROOT / "configs" / "default.yaml"

# Values the trainer runs, fewer than the section's type accepts (llama.ProjectionConfig also knows
# torchao_fp8, which the model builder rejects with the reason). A YAML value is checked before the
# type's own checks, so that the message lists only these.
PROJECTION_PRECISIONS = ("bf16", "te_fp8")
TRAINER_CHOICES = {"projection": {"precision": PROJECTION_PRECISIONS}}
NONFINITE_POLICIES = ("skip", "stop")
WANDB_MODES = ("disabled", "offline", "online")
TOKENIZER_KINDS = ("llama3", "hf")
# the choices of string keys, named when YAML turned a value into a boolean (_coerce)
STRING_CHOICES = {
    "projection.precision": PROJECTION_PRECISIONS,
    "runtime.nonfinite": NONFINITE_POLICIES,
    "logging.wandb_mode": WANDB_MODES,
    "data.tokenizer": TOKENIZER_KINDS,
}


# ----------------------------------------------------------------------------------------- sections


@dataclass(frozen=True, kw_only=True)
class ModelSection:
    """``preset`` (llama3_1_8b, small, tiny) and overrides of LlamaConfig fields, e.g. ``vocab_size``."""

    preset: str = "tiny"
    overrides: dict = field(default_factory=lambda: {"vocab_size": 128256})

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"model.preset={self.preset!r} is unknown; choose one of {', '.join(PRESETS)}")
        valid = model_override_keys()
        bad = sorted(set(self.overrides) - set(valid))
        if bad:
            raise ValueError(
                f"model: unknown key(s) {', '.join(bad)}{_did_you_mean(bad, ['preset', *valid])}; "
                f"valid keys: preset, {', '.join(valid)}"
            )
        hints = typing.get_type_hints(LlamaConfig)
        object.__setattr__(
            self, "overrides", {k: _coerce(f"model.{k}", hints[k], v) for k, v in self.overrides.items()}
        )
        self.llama_base()  # validates the shapes (LlamaConfig raises ValueError with the fix)

    def llama_base(self):
        """The LlamaConfig of the preset with the overrides (attention/projection at their defaults)."""
        try:
            return preset(self.preset, **self.overrides)
        except ValueError as err:
            raise ValueError(f"model: {err}") from None


@dataclass(frozen=True, kw_only=True)
class DataSection:
    """``corpus``: ``default`` (the embedded KJV + CPython stdlib blend, prepared on first use) or a
    list of ``{prefix: <indexed dataset prefix>, weight: <float>}`` (``path`` is accepted for
    ``prefix``) with a Megatron ``split`` such as ``"969,30,1"``."""

    corpus: Any = "default"
    tokenizer: str = "llama3"
    tokenizer_path: str | None = None
    seq_length: int = 256
    split: str | None = None
    seed: int = 1234
    cache_dir: str | None = None
    num_workers: int = 0

    def __post_init__(self):
        if self.corpus != "default":
            if not isinstance(self.corpus, list) or not self.corpus:
                raise ValueError(
                    "data.corpus must be 'default' or a non-empty list of {prefix: PATH, weight: W}"
                )
            norm = []
            for i, entry in enumerate(self.corpus):
                if not isinstance(entry, dict):
                    raise ValueError(
                        f"data.corpus[{i}] must be a mapping {{prefix: PATH, weight: W}}, got {entry!r}"
                    )
                bad = set(entry) - {"prefix", "path", "weight"}
                if bad or ("prefix" in entry) == ("path" in entry):
                    raise ValueError(
                        f"data.corpus[{i}]={entry!r}: give exactly one of prefix/path and optionally "
                        "weight (default 1.0)"
                    )
                weight = _coerce(f"data.corpus[{i}].weight", float, entry.get("weight", 1.0))
                if not weight > 0:
                    raise ValueError(f"data.corpus[{i}].weight must be > 0, got {weight}")
                norm.append({"prefix": str(entry.get("prefix", entry.get("path"))), "weight": weight})
            object.__setattr__(self, "corpus", norm)
            if self.split is None:
                raise ValueError("data.split is needed with a custom corpus, e.g. data.split='969,30,1'")
        elif self.split is not None:
            raise ValueError(
                "data.split must be null with corpus 'default' (it is split 98/1/1 at preparation)"
            )
        if self.tokenizer not in TOKENIZER_KINDS:
            raise ValueError(f"data.tokenizer={self.tokenizer!r}; choose one of {', '.join(TOKENIZER_KINDS)}")
        if self.tokenizer == "hf" and not self.tokenizer_path:
            raise ValueError(
                "data.tokenizer='hf' needs data.tokenizer_path (a local HuggingFace tokenizer directory)"
            )
        if self.seq_length < 1:
            raise ValueError(f"data.seq_length must be >= 1, got {self.seq_length}")
        if self.num_workers < 0:
            raise ValueError(f"data.num_workers must be >= 0, got {self.num_workers}")


@dataclass(frozen=True, kw_only=True)
class TrainingSection:
    """Batch, duration, AdamW and the LR schedule (linear warmup, cosine decay to ``min_lr``)."""

    micro_batch_size: int = 2
    global_batch_size: int = 4
    train_tokens: int | None = None
    train_iters: int | None = 80
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_iters: int = 8
    lr_decay_style: str = "cosine"
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    seed: int = 1234
    # null: megatron-core's default (initialise on the GPU, each tensor-parallel shard from its own RNG
    # stream; on the CPU when there is no GPU). true: initialise the full weights on the CPU from
    # ``seed``, then shard (Megatron-LM's --use-cpu-initialization): the same initial model for any TP
    # size, as TP-parity checks need; slower start.
    use_cpu_initialization: bool | None = None

    def __post_init__(self):
        if self.micro_batch_size < 1 or self.global_batch_size < 1:
            raise ValueError("training.micro_batch_size and training.global_batch_size must be >= 1")
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"training.global_batch_size={self.global_batch_size} is not a multiple of "
                f"micro_batch_size={self.micro_batch_size}"
            )
        if (self.train_tokens is None) == (self.train_iters is None):
            raise ValueError(
                "give exactly one of training.train_tokens and training.train_iters (set the other to null)"
            )
        if self.train_iters is not None and self.train_iters < 1:
            raise ValueError(f"training.train_iters must be >= 1, got {self.train_iters}")
        if self.train_tokens is not None and self.train_tokens < 1:
            raise ValueError(f"training.train_tokens must be >= 1, got {self.train_tokens}")
        if not (math.isfinite(self.lr) and self.lr > 0) or not (
            math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.lr
        ):
            raise ValueError(
                f"training: need lr > 0 and 0 <= min_lr <= lr, got lr={self.lr}, min_lr={self.min_lr}"
            )
        if self.warmup_iters < 0:
            raise ValueError(f"training.warmup_iters must be >= 0, got {self.warmup_iters}")
        if self.lr_decay_style != "cosine":
            raise ValueError(f"training.lr_decay_style={self.lr_decay_style!r}; only 'cosine' is implemented")
        if (
            self.weight_decay < 0
            or not (math.isfinite(self.adam_eps) and self.adam_eps > 0)
            or not (0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1)
        ):
            raise ValueError("training: need weight_decay >= 0, adam_eps > 0 and betas in [0, 1)")
        if self.clip_grad < 0:
            raise ValueError(f"training.clip_grad must be >= 0 (0 = no clipping), got {self.clip_grad}")

    def iters(self, seq_length: int) -> int:
        """Optimizer steps: ``train_iters``, or ``ceil(train_tokens / (global_batch_size * seq_length))``.

        Rounding up means the last step completes the token budget (it overshoots by less than one step).
        """
        if self.train_iters is not None:
            return self.train_iters
        return -(-self.train_tokens // (self.global_batch_size * seq_length))


@dataclass(frozen=True, kw_only=True)
class CheckpointSection:
    """``dir`` (default ``<output_dir>/checkpoints``); ``save``: ``false`` writes no checkpoint at all
    (not every ``save_interval`` steps, not at the end, not on a signal or the time budget, which
    still exit with their codes 3 / 4; for benchmarks, where an 8B-shaped checkpoint would cost
    ~70 GB and minutes); ``save_interval`` steps (0 = only at the end and on exit); ``keep_last``
    complete checkpoints up to the newest save (later iterations, left by a run resumed from an
    earlier one, are kept: ``checkpoint.prune``); ``load``: ``auto`` (the complete one that
    ``latest_checkpointed_iteration.txt`` names in ``dir``, else the newest older one, if any),
    ``none`` (from scratch; refused when saving into a ``dir`` that holds checkpoints), or a
    checkpoint directory; ``allow_config_change``: resolved-config keys (or section names) allowed to
    differ from the checkpoint's on resume (``data.identity`` and ``data.content`` for the data).

    A run with ``save: false`` starts fresh: ``load`` must be ``none``, or ``auto`` finding nothing
    (the trainer stops with a configuration error, exit code 2, when ``auto`` finds a checkpoint),
    so that a run that keeps nothing never continues, and silently abandons, another run's state.
    """

    dir: str | None = None
    save: bool = True
    save_interval: int = 40
    keep_last: int = 1
    async_save: bool = False
    load: str = "auto"
    allow_config_change: list = field(default_factory=list)

    def __post_init__(self):
        if self.save_interval < 0:
            raise ValueError(f"checkpoint.save_interval must be >= 0, got {self.save_interval}")
        if self.keep_last < 1:
            raise ValueError(f"checkpoint.keep_last must be >= 1, got {self.keep_last}")
        if not self.load:
            raise ValueError("checkpoint.load must be 'auto', 'none' or a checkpoint path")
        if not self.save and self.load not in ("auto", "none"):
            raise ValueError(
                f"checkpoint.save=false starts a fresh run that writes no checkpoint, so it cannot "
                f"load one: got checkpoint.load={self.load!r}; use checkpoint.load=none (or auto, "
                "which must find nothing), or checkpoint.save=true to resume and keep saving"
            )
        allow = self.allow_config_change
        if isinstance(allow, str):
            allow = [a.strip() for a in allow.split(",") if a.strip()]
        if not isinstance(allow, list) or not all(isinstance(a, str) for a in allow):
            raise ValueError(f"checkpoint.allow_config_change must be a list of keys, got {allow!r}")
        object.__setattr__(self, "allow_config_change", list(allow))


@dataclass(frozen=True, kw_only=True)
class LoggingSection:
    """Metrics file (relative to output_dir), TensorBoard, wandb, attention telemetry, MFU peak."""

    log_interval: int = 1
    metrics_file: str = "metrics.jsonl"
    tensorboard: bool = True
    wandb_mode: str = "disabled"
    wandb_project: str = "fp4-attention-pretrain"
    telemetry_interval: int = 20
    peak_flops_per_gpu: float = 989.4e12
    progress_bar: bool = True

    def __post_init__(self):
        if self.log_interval < 1:
            raise ValueError(f"logging.log_interval must be >= 1, got {self.log_interval}")
        if self.wandb_mode not in WANDB_MODES:
            raise ValueError(
                f"logging.wandb_mode={self.wandb_mode!r}; choose one of {', '.join(WANDB_MODES)}"
            )
        if self.telemetry_interval < 0:
            raise ValueError("logging.telemetry_interval must be >= 0 (0 = off)")
        if not self.peak_flops_per_gpu > 0:
            raise ValueError("logging.peak_flops_per_gpu must be > 0 (989.4e12 = H100/H200 dense BF16)")
        if not self.metrics_file:
            raise ValueError("logging.metrics_file must name a file")


@dataclass(frozen=True, kw_only=True)
class ValidationSection:
    """Validation loss on the held-out split every ``interval`` steps (and at the end) over ``iters``
    global batches (the same batches every time; 0 = off)."""

    interval: int = 20
    iters: int = 2

    def __post_init__(self):
        if self.interval < 0 or self.iters < 0:
            raise ValueError("validation.interval and validation.iters must be >= 0 (0 = off)")


@dataclass(frozen=True, kw_only=True)
class RuntimeSection:
    """``exit_duration_mins``: save and exit after this many minutes from process start;
    ``nonfinite``: ``skip`` (skip the step and count it) or ``stop``; ``deterministic``: deterministic
    algorithms; ``output_dir``: the run directory (metrics, run_meta.json, checkpoints)."""

    exit_duration_mins: float | None = None
    nonfinite: str = "skip"
    deterministic: bool = False
    output_dir: str = "runs/default"

    def __post_init__(self):
        if self.exit_duration_mins is not None and not self.exit_duration_mins > 0:
            raise ValueError(f"runtime.exit_duration_mins must be > 0 or null, got {self.exit_duration_mins}")
        if self.nonfinite not in NONFINITE_POLICIES:
            raise ValueError(
                f"runtime.nonfinite={self.nonfinite!r}; choose one of {', '.join(NONFINITE_POLICIES)}"
            )
        if not self.output_dir:
            raise ValueError("runtime.output_dir must name a directory")


CONFIG_SECTIONS = {
    "model": ModelSection,
    "attention": AttentionConfig,
    "projection": ProjectionConfig,
    "parallel": ParallelConfig,
    "data": DataSection,
    "training": TrainingSection,
    "checkpoint": CheckpointSection,
    "logging": LoggingSection,
    "validation": ValidationSection,
    "runtime": RuntimeSection,
}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The whole job configuration (one field per section)."""

    model: ModelSection = field(default_factory=ModelSection)
    attention: AttentionConfig = field(default_factory=lambda: AttentionConfig(recipe="fp8"))
    projection: ProjectionConfig = field(default_factory=ProjectionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataSection = field(default_factory=DataSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    validation: ValidationSection = field(default_factory=ValidationSection)
    runtime: RuntimeSection = field(default_factory=RuntimeSection)

    def __post_init__(self):
        if self.attention.recipe not in TRAINING_RECIPES:
            raise ValueError(
                f"attention.recipe={self.attention.recipe!r} cannot train; choose one of "
                f"{', '.join(TRAINING_RECIPES)}"
            )
        for name in TRAINER_CHOICES:
            _check_trainer_choices(name, dataclasses.asdict(getattr(self, name)))
        llama = self.llama()
        if self.data.seq_length > llama.max_seq_length:
            raise ValueError(
                f"data.seq_length={self.data.seq_length} exceeds model.max_seq_length="
                f"{llama.max_seq_length}; lower data.seq_length or set model.max_seq_length"
            )
        if self.data.tokenizer == "llama3" and llama.vocab_size < 128256:
            raise ValueError(
                f"model.vocab_size={llama.vocab_size} is smaller than the Llama-3 tokenizer's 128256 "
                "ids; set model.vocab_size=128256"
            )
        iters = self.train_iters
        if self.training.warmup_iters >= iters:
            raise ValueError(
                f"training.warmup_iters={self.training.warmup_iters} must be < the number of "
                f"steps ({iters}); lower warmup_iters or train longer"
            )

    @property
    def train_iters(self) -> int:
        return self.training.iters(self.data.seq_length)

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch_size * self.data.seq_length

    def llama(self):
        """The :class:`llama.LlamaConfig` to build (its ``attention`` is this config's, unchanged)."""
        base = self.model.llama_base()
        try:
            return base.replace(attention=self.attention, projection=self.projection)
        except ValueError as err:
            raise ValueError(f"model/projection: {err}") from None

    def replace(self, **sections) -> TrainConfig:
        return dataclasses.replace(self, **sections)


# ----------------------------------------------------------------------------------- loading


def model_override_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(LlamaConfig) if f.name not in ("attention", "projection")]


def _coerce(name: str, typ, value):
    """Check ``value`` against the annotation ``typ``; accept numeric strings for numbers."""
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and type(None) in args:
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(name, inner[0], value) if len(inner) == 1 else value
    if origin is typing.Literal:  # checked as the type of its values; which value: the section says
        kinds = {type(a) for a in args}
        return _coerce(name, kinds.pop(), value) if len(kinds) == 1 else value
    if typ is Any or origin in (list, dict) or typ in (list, dict):
        return value
    if typ is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if isinstance(value, int):
            return value
        try:
            f = float(value)
        except (TypeError, ValueError):
            f = math.nan
        if math.isfinite(f) and f.is_integer():
            return int(f)
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if typ is float:
        if isinstance(value, bool):
            raise ValueError(f"{name} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number, got {value!r}") from None
    if typ is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):  # found in review, 2026-12-06: logging.wandb_mode=yes
            raise ValueError(
                f"{name} must be a string, got {value!r}: YAML reads an unquoted yes, no, on, off, true "
                "or false as a boolean; "
                + (
                    f"choose one of {', '.join(STRING_CHOICES[name])}"
                    if name in STRING_CHOICES
                    else "quote the value"
                )
            )
        raise ValueError(f"{name} must be a string, got {value!r}")
    return value


def _did_you_mean(bad: list[str], valid) -> str:
    """`` (did you mean train_iters?)`` for the unknown names that are close to a valid one
    (``difflib``), else ``""``."""
    close = [m[0] for b in bad if (m := difflib.get_close_matches(b, list(valid), n=1, cutoff=0.75))]
    return f" (did you mean {', '.join(dict.fromkeys(close))}?)" if close else ""


def _build_section(name: str, cls, raw) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"config section {name!r} must be a mapping, got {type(raw).__name__}")
    if cls is ModelSection:
        raw = dict(raw)
        preset_name = raw.pop("preset", ModelSection.preset)
        return ModelSection(preset=preset_name, overrides=raw)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    bad = sorted(set(raw) - set(fields))
    if bad:
        raise ValueError(
            f"{name}: unknown key(s) {', '.join(bad)}{_did_you_mean(bad, fields)}; "
            f"valid keys: {', '.join(fields)}"
        )
    hints = typing.get_type_hints(cls)
    values = {k: _coerce(f"{name}.{k}", hints[k], v) for k, v in raw.items()}
    _check_trainer_choices(name, values)
    return dataclasses.replace(_default_section(name), **values)


def _check_trainer_choices(name: str, values: dict) -> None:
    """Raise ValueError for a value of section ``name`` outside :data:`TRAINER_CHOICES`."""
    for key, choices in TRAINER_CHOICES.get(name, {}).items():
        if key in values and values[key] not in choices:
            raise ValueError(f"{name}.{key}={values[key]!r}; choose one of {', '.join(choices)}")


def _default_section(name: str):
    """The section as :class:`TrainConfig` has it by default (a key missing from a section keeps it)."""
    f = next(f for f in dataclasses.fields(TrainConfig) if f.name == name)
    return f.default_factory()


def from_dict(raw: dict | None) -> TrainConfig:
    """Validate a config mapping (as read from YAML) into a :class:`TrainConfig`.

    A missing section or key takes the embedded default. A ``model`` section replaces the default
    model (preset ``tiny`` with ``vocab_size: 128256``) as a whole; ``model.*`` command-line
    overrides on top of the default keep it.

    Raises:
        ValueError: unknown section/key (lists the valid ones) or an invalid value (says how to fix it).
    """
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ValueError(f"a config must be a mapping of sections, got {type(raw).__name__}")
    bad = sorted(set(raw) - set(CONFIG_SECTIONS))
    if bad:
        raise ValueError(
            f"unknown config section(s) {', '.join(bad)}{_did_you_mean(bad, CONFIG_SECTIONS)}; "
            f"valid sections: {', '.join(CONFIG_SECTIONS)}"
        )
    sections = {
        name: _build_section(name, cls, raw[name]) for name, cls in CONFIG_SECTIONS.items() if name in raw
    }
    return TrainConfig(**sections)


def apply_overrides(raw: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Apply dotted ``section.key=value`` overrides (values parsed with ``yaml.safe_load``) to ``raw``.

    Raises:
        ValueError: ``raw`` is not a mapping; an override without ``=``, without exactly one dot in
            its key, of an unknown section, or whose value is not valid YAML or carries a YAML tag
            (``!!python/...``: values are plain data, never constructed objects).
    """
    if raw is not None and not isinstance(raw, dict):
        raise ValueError(f"a config must be a mapping of sections, got {type(raw).__name__}")
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (raw or {}).items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) != 2 or not all(parts):
            raise ValueError(
                f"override {item!r} must look like section.key=value, e.g. training.train_iters=50"
            )
        section, name = parts
        if section not in CONFIG_SECTIONS:
            raise ValueError(
                f"override {item!r}: unknown section {section!r}{_did_you_mean([section], CONFIG_SECTIONS)}; "
                f"valid sections: {', '.join(CONFIG_SECTIONS)}"
            )
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as err:
            problem = _yaml_problem(err, lines=False)
            hint = (
                ""
                if "tags are not allowed" in problem
                else "; quote a string (section.key='...'), write a list as [a, b] and a mapping as {k: v}"
            )
            raise ValueError(f"override {item!r}: the value is not valid YAML ({problem}){hint}") from None
        sec = raw.get(section)
        if sec is not None and not isinstance(sec, dict):
            raise ValueError(f"config section {section!r} must be a mapping, got {type(sec).__name__}")
        sec = dict(sec) if isinstance(sec, dict) else {}
        if section == "model" and "model" not in raw and name != "preset":
            sec = {"preset": ModelSection.preset, **ModelSection().overrides}
        sec[name] = value
        raw[section] = sec
    return raw


def _yaml_problem(err: yaml.YAMLError, *, lines: bool) -> str:
    """One line saying where and what is wrong in a YAML text (PyYAML's own message spans lines)."""
    problem = (getattr(err, "problem", None) or str(err).splitlines()[0]).replace("tag:yaml.org,2002:", "!!")
    if "constructor for the tag" in problem:
        problem += " (YAML tags are not allowed: a config holds plain numbers, strings, lists and mappings)"
    mark = getattr(err, "problem_mark", None)
    if mark is None:
        return problem
    where = f"line {mark.line + 1}, column {mark.column + 1}" if lines else f"column {mark.column + 1}"
    return f"{where}: {problem}"


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Read a YAML config (None = the embedded default) and apply dotted overrides.

    Raises:
        ValueError: the file does not exist, is a directory, cannot be read, is not UTF-8, is not
            valid YAML (or uses a YAML tag) or does not hold a mapping of sections (each message
            names the file); and see :func:`from_dict` / :func:`apply_overrides`.
    """
    raw: dict = {}
    if path is not None:
        raw = _read_config_file(Path(path))
    return from_dict(apply_overrides(raw, list(overrides)))


def _read_config_file(path: Path) -> dict:
    """The mapping of sections in the YAML file ``path`` (empty file: ``{}``); ValueError naming it."""
    if not path.exists():
        raise ValueError(f"config file {path} does not exist")
    if path.is_dir():
        raise ValueError(f"config file {path} is a directory, not a YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"config file {path} is not UTF-8 text (byte {err.start}); save it as UTF-8"
        ) from None
    except OSError as err:
        raise ValueError(f"config file {path} cannot be read ({err.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"config file {path}: not valid YAML ({_yaml_problem(err, lines=True)})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(
            f"config file {path} must hold a mapping of sections (model:, training:, ...), "
            f"not a {type(raw).__name__}"
        )
    return raw
