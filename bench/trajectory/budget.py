"""The budget of a long trajectory session: how many steps every run gets so that all of them finish
inside the device time, which GPU runs which run, and how many device calls that takes.

Device limits (``/work/.library/device/README.md``): one command runs at most 600 s; a machine is
held at most 30 minutes (1800 s), idle or busy, and a developer session has 30 minutes of device
time, the machine's start included; a machine stays warm 30 s after a call, then goes back (with
everything on it). So a 17-minute run cannot finish inside one call. Decision: the runs are started
*detached* (``setsid``: the README says such processes run on until the machine goes back) and keep
training between calls; each call (the same command every time) starts what is not running,
reports progress until its own deadline and returns; the last one compares and packs. Preempting
with SIGTERM at every call's end and resuming in the next (the trainer supports it) was not chosen:
each boundary would cost a checkpoint save, a process start and the gap between calls, ~90 s of
training per run per boundary. Resume is still used, automatically, for a run found neither
running nor finished (its process was lost): it restarts from its last periodic checkpoint.

Arithmetic (seconds from the first call's start; all parameters are options of the CLI)::

    step_s(arm)    = tokens_per_step / tokens_per_s_per_gpu(arm) * (1 + margin)
    eval_s(arm)    = validation.iters * tokens_per_step / (3 * tokens_per_s_per_gpu(arm))   # forward only
    run_s(arm, N)  = run_start_s + N * step_s + evals(N) * eval_s + saves(N) * save_s
    lane_s         = sum of run_s over the runs of one GPU (one run per GPU: run_s)
    session_s      = setup_s + max(lane_s) + final_s
    device_s       = start_s + session_s + warm_s          <= hold_s
    calls          = ceil((session_s + gap_s) / (call_s + gap_s))

``train_iters`` N is the largest multiple of the validation interval (evaluations evenly spaced, the
last one at the end) that satisfies ``device_s <= hold_s`` (or the one given, checked); fewer than
``min_tokens`` tokens per run is refused. The runs train until, at the latest,
``stop_at_s = hold_s - start_s - warm_s - final_s`` (``runtime.exit_duration_mins``, set at each
launch): a run slower than planned saves a checkpoint and stops (exit 4) in time for the
last call to compare and pack what every run has.

Throughput: the slowest run's median tokens/s/GPU per arm from ``results/trajectory/compare/summary.json``
(the 2026-11-29 trajectories on an H200, one run per GPU, same model, sequence and batch), or
``--tokens-per-s ARM=N``; an arm measured in neither place is refused (no guess).

Runs: the arms in the order given (priority: the baseline, then the recipe under test, ...), seed by
seed: with more runs than GPUs, the runs are dealt round-robin to the GPUs (runs of one GPU one after
another) if that still gives ``min_tokens`` per run; otherwise the first ``gpus`` runs in that order
run, one per GPU, and the rest are *deferred*: the plan prints the command that runs each of them
later with the same ``train_iters`` (same data order, same schedule) on any machine of the same kind.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import REPO

DEVICE_CALL_LIMIT_S = 600  # one command's run (timeout_s at most)
DEVICE_HOLD_S = 1800  # a machine held, idle or busy; also a developer session's device time
DEVICE_WARM_S = 30  # a machine stays warm this long after a call, then goes back
DEFAULT_CONFIG = "configs/trajectory_small_s2048.yaml"
DEFAULT_ARMS = ("bf16", "nvfp4qk_fp8pv", "fp8")
DEFAULT_SEEDS = (1234, 1235, 1236)
MEASURED = REPO / "results" / "trajectory" / "compare" / "summary.json"
ROTATIONS = ("hadamard",)


@dataclass(frozen=True)
class Budget:
    """Wall-clock parameters of a session (seconds; ``margin`` a fraction of the step time)."""

    hold_s: float = DEVICE_HOLD_S  # device time of the session = the longest a machine is held
    start_s: float = 150.0  # the machine's start before the first call's command runs
    call_s: float = 560.0  # each call's own deadline (the device allows DEVICE_CALL_LIMIT_S)
    gap_s: float = 30.0  # between two calls (the runs go on training)
    setup_s: float = 120.0  # first call: wheels, code copy, data preparation
    run_start_s: float = 60.0  # process start to the first step (imports, model, Triton compile)
    final_s: float = 60.0  # compare_runs and packing, after the last run
    save_s: float = 5.0  # one checkpoint save (1.5 GiB of the small model: 2.1-2.4 s measured)
    margin: float = 0.10  # on the measured step time
    warm_s: float = DEVICE_WARM_S  # idle after the last call until the machine goes back

    def check(self) -> None:
        """Raise ValueError for parameters the device cannot honour, naming the limit."""
        for name in ("hold_s", "call_s", "start_s", "gap_s", "setup_s", "run_start_s", "final_s", "save_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.call_s <= DEVICE_CALL_LIMIT_S - 20:
            raise ValueError(
                f"--call-s {self.call_s:g}: one device call runs at most {DEVICE_CALL_LIMIT_S} s; leave "
                f"at least 20 s for packing and the exit (at most {DEVICE_CALL_LIMIT_S - 20})"
            )
        if self.gap_s > DEVICE_WARM_S:
            raise ValueError(
                f"--gap-s {self.gap_s:g}: the machine goes back {DEVICE_WARM_S} s after a call, taking "
                "the runs with it; the next call must come sooner"
            )
        if not 0 <= self.margin < 1:
            raise ValueError(f"--margin must be in [0, 1), got {self.margin}")


@dataclass(frozen=True)
class Arm:
    """An arm: an attention recipe, optionally with a Q/K rotation (``nvfp4qk_fp8pv+hadamard``)."""

    name: str
    recipe: str
    rotation: str | None

    @property
    def overrides(self) -> tuple[str, ...]:
        rot = (f"attention.qk_rotation={self.rotation}",) if self.rotation else ()
        return (f"attention.recipe={self.recipe}", *rot)

    @property
    def compare_label(self) -> str:
        """The arm's label in tools/compare_runs.py (BF16 projections)."""
        return f"attn={self.name},proj=bf16"


def parse_arm(name: str) -> Arm:
    """``RECIPE`` or ``RECIPE+ROTATION``; ValueError naming the choices."""
    from fp4_attention import TRAINING_RECIPES

    recipe, _, rotation = name.partition("+")
    if recipe not in TRAINING_RECIPES:
        raise ValueError(
            f"arm {name!r}: recipe {recipe!r} cannot train; choose {', '.join(TRAINING_RECIPES)}"
        )
    if rotation and rotation not in ROTATIONS:
        raise ValueError(f"arm {name!r}: unknown Q/K rotation {rotation!r}; choose {', '.join(ROTATIONS)}")
    return Arm(name=name, recipe=recipe, rotation=rotation or None)


def measured_throughput(path: Path = MEASURED) -> dict[str, tuple[float, str]]:
    """``{compare arm label: (tokens/s/GPU, source)}``: the slowest run's median per arm in a
    tools/compare_runs.py ``summary.json`` ({} when the file is absent)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read the measured throughput ({err})") from None
    out: dict[str, tuple[float, str]] = {}
    for run in data.get("runs", []):
        tps = run.get("median_tokens_per_s_per_gpu")
        if not isinstance(tps, (int, float)) or tps <= 0:
            continue
        label = run.get("arm")
        if label not in out or tps < out[label][0]:
            out[label] = (float(tps), f"{run.get('name')} in {_rel(path)}")
    return out


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class RunPlan:
    """One training run: its name (``<arm>_seed<seed>``), GPU, position in that GPU's lane and
    trainer overrides (the data corpus and the time budget are added on the machine)."""

    name: str
    arm: str
    seed: int
    gpu: int
    order: int
    overrides: tuple[str, ...]
    tokens_per_s: float
    wall_s: float


@dataclass(frozen=True)
class Plan:
    """The session: runs per GPU, steps, tokens, the timeline (seconds from the first call's start)."""

    config: str
    gpus: int
    arms: tuple[Arm, ...]
    seeds: tuple[int, ...]
    runs: tuple[RunPlan, ...]
    deferred: tuple[tuple[str, str, int], ...]  # (name, arm, seed)
    train_iters: int
    tokens_per_step: int
    warmup_iters: int
    val_interval: int
    val_iters: int
    save_interval: int
    telemetry_interval: int
    min_tokens: int
    budget: Budget
    throughput: dict  # arm name -> (tokens/s/GPU, source)
    lane_s: dict  # gpu -> seconds
    session_s: float
    stop_at_s: float
    calls: tuple[tuple[float, float], ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def tokens(self) -> int:
        return self.train_iters * self.tokens_per_step

    @property
    def device_s(self) -> float:
        return self.budget.start_s + self.session_s + self.budget.warm_s

    @property
    def evals(self) -> int:
        return _count(self.train_iters, self.val_interval)

    def to_dict(self) -> dict:
        """JSON-ready (plan.json on the machine: the later calls read it, never recompute it)."""
        return {
            "config": self.config,
            "gpus": self.gpus,
            "arms": [a.name for a in self.arms],
            "seeds": list(self.seeds),
            "runs": [
                {
                    "name": r.name,
                    "arm": r.arm,
                    "seed": r.seed,
                    "gpu": r.gpu,
                    "order": r.order,
                    "overrides": list(r.overrides),
                    "tokens_per_s": r.tokens_per_s,
                    "wall_s": r.wall_s,
                }
                for r in self.runs
            ],
            "deferred": [list(d) for d in self.deferred],
            "train_iters": self.train_iters,
            "tokens_per_run": self.tokens,
            "stop_at_s": self.stop_at_s,
            "session_s": self.session_s,
            "calls": [list(c) for c in self.calls],
            "budget": self.budget.__dict__,
        }


def _count(steps: int, interval: int) -> int:
    """Events every ``interval`` steps plus one at the end (validation, saves)."""
    return steps // interval + (1 if steps % interval else 0)


def run_seconds(
    steps: int,
    tps: float,
    *,
    tokens_per_step: int,
    b: Budget,
    val_interval: int,
    val_iters: int,
    save_interval: int,
) -> float:
    """Wall clock of one run of ``steps`` steps at ``tps`` tokens/s/GPU (see the module docstring)."""
    step_s = tokens_per_step / tps * (1.0 + b.margin)
    eval_s = val_iters * tokens_per_step / (3.0 * tps)
    return (
        b.run_start_s
        + steps * step_s
        + _count(steps, val_interval) * eval_s
        + _count(steps, save_interval) * b.save_s
    )


def _schedule(names: list[tuple[str, Arm, int]], gpus: int) -> dict[int, list[tuple[str, Arm, int]]]:
    lanes: dict[int, list] = {g: [] for g in range(min(gpus, len(names)))}
    for i, item in enumerate(names):
        lanes[i % gpus].append(item)
    return lanes


def _available(b: Budget) -> float:
    """Seconds a lane may take: the device time less everything that is not a run."""
    return b.hold_s - b.start_s - b.warm_s - b.setup_s - b.final_s


def _fit(lanes, tps: dict, *, b: Budget, tokens_per_step: int, intervals, rounding: int) -> int:
    """The largest step count (a multiple of ``rounding``, >= 0) whose slowest lane fits."""
    avail = _available(b)

    def worst(n: int) -> float:
        return max(
            sum(
                run_seconds(n, tps[arm.name], tokens_per_step=tokens_per_step, b=b, **intervals(n))
                for _, arm, _ in lane
            )
            for lane in lanes.values()
        )

    lo, hi = 0, 1
    while worst(hi) <= avail and hi < 10**8:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if worst(mid) <= avail:
            lo = mid
        else:
            hi = mid
    return lo - lo % rounding


def make_plan(
    *,
    gpus: int,
    config: str = DEFAULT_CONFIG,
    arms: tuple[str, ...] = DEFAULT_ARMS,
    seeds: tuple[int, ...] = DEFAULT_SEEDS,
    only: tuple[str, ...] = (),
    budget: Budget = Budget(),
    min_tokens: int = 200_000_000,
    train_iters: int | None = None,
    tokens_per_s: dict[str, float] | None = None,
    measured: Path = MEASURED,
    val_every_tokens: int = 10_000_000,
    val_iters: int = 8,
    telemetry_interval: int = 40,
    warmup_frac: float = 0.02,
    output_root: str = "/tmp/trajectory",
) -> Plan:
    """The plan for ``gpus`` GPUs; see the module docstring.

    Raises:
        ValueError: bad arms/seeds/budget, an arm without a measured throughput, a run named in
            ``only`` that is not in the arms x seeds, or fewer than ``min_tokens`` tokens per run fit.
    """
    from training.config import load_config

    budget.check()
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if not arms or not seeds:
        raise ValueError("give at least one arm and one seed")
    if len(set(arms)) != len(arms) or len(set(seeds)) != len(seeds):
        raise ValueError("an arm or a seed is given twice")
    arm_objs = tuple(parse_arm(a) for a in arms)
    base_cfg = load_config(REPO / config)
    tokens_per_step = base_cfg.tokens_per_step
    val_interval = max(1, round(val_every_tokens / tokens_per_step))
    save_interval = 2 * val_interval

    measured_tps = measured_throughput(measured)
    tps: dict[str, tuple[float, str]] = {}
    for a in arm_objs:
        if tokens_per_s and a.name in tokens_per_s:
            tps[a.name] = (float(tokens_per_s[a.name]), "--tokens-per-s")
        elif a.compare_label in measured_tps:
            tps[a.name] = measured_tps[a.compare_label]
        else:
            raise ValueError(
                f"no measured tokens/s/GPU for arm {a.name!r} in {_rel(measured)} "
                f"(arm {a.compare_label}); pass --tokens-per-s {a.name}=N from a measurement"
            )
    tps_value = {k: v[0] for k, v in tps.items()}

    every = [(f"{a.name}_seed{s}", a, s) for s in seeds for a in arm_objs]
    if only:
        unknown = sorted(set(only) - {n for n, _, _ in every})
        if unknown:
            raise ValueError(
                f"--runs {', '.join(unknown)}: not among the runs {', '.join(n for n, _, _ in every)}"
            )
        every = [item for item in every if item[0] in only]

    def intervals(_n: int) -> dict:
        return {"val_interval": val_interval, "val_iters": val_iters, "save_interval": save_interval}

    fit_kw = {
        "b": budget,
        "tokens_per_step": tokens_per_step,
        "intervals": intervals,
        "rounding": val_interval,
    }
    notes: list[str] = []
    scheduled, deferred = every, []
    lanes = _schedule(scheduled, gpus)
    steps_fit = _fit(lanes, tps_value, **fit_kw)
    if len(every) > gpus and steps_fit * tokens_per_step < min_tokens:
        waves = math.ceil(len(every) / gpus)
        one_wave = _fit(_schedule(every[:gpus], gpus), tps_value, **fit_kw)
        notes.append(
            f"{len(every)} runs on {gpus} GPUs in {waves} waves would give at most "
            f"{steps_fit * tokens_per_step:,} tokens per run (< {min_tokens:,}): the first {gpus} runs "
            f"run at once (one per GPU, up to {one_wave * tokens_per_step:,} tokens each) and "
            f"{len(every) - gpus} is deferred to a later session (same train_iters, same data order)"
        )
        scheduled, deferred = every[:gpus], every[gpus:]
        lanes = _schedule(scheduled, gpus)
        steps_fit = one_wave
    steps = steps_fit if train_iters is None else train_iters
    if train_iters is not None and train_iters > steps_fit:
        raise ValueError(
            f"--train-iters {train_iters:,} does not fit the budget: at most {steps_fit:,} steps "
            f"({steps_fit * tokens_per_step:,} tokens) per run fit on {gpus} GPU(s)"
        )
    if train_iters is not None and steps * tokens_per_step < min_tokens:
        raise ValueError(
            f"--train-iters {train_iters:,} gives {steps * tokens_per_step:,} tokens per run, below "
            f"--min-tokens {min_tokens:,}; raise --train-iters (at most {steps_fit:,} fit) or lower "
            "--min-tokens"
        )
    if steps * tokens_per_step < min_tokens:
        slow = min(tps_value, key=tps_value.get)
        need = run_seconds(
            -(-min_tokens // tokens_per_step),
            tps_value[slow],
            tokens_per_step=tokens_per_step,
            b=budget,
            **intervals(0),
        )
        raise ValueError(
            f"{min_tokens:,} tokens per run do not fit: at most {steps_fit * tokens_per_step:,} "
            f"({steps_fit:,} steps) do; the slowest arm, {slow} at {tps_value[slow]:,.0f} tokens/s/GPU, "
            f"needs {need:,.0f} s per run and a GPU has {_available(budget):,.0f} s (device time "
            f"{budget.hold_s:g} s less start {budget.start_s:g}, set-up {budget.setup_s:g}, compare "
            f"{budget.final_s:g} and the last idle {budget.warm_s:g}); use more GPUs, fewer runs "
            "(--runs) or lower --min-tokens"
        )
    warmup = max(1, round(warmup_frac * steps))
    runs = []
    lane_s = {}
    for g, lane in lanes.items():
        total = 0.0
        for order, (name, arm, seed) in enumerate(lane):
            wall = run_seconds(
                steps, tps_value[arm.name], tokens_per_step=tokens_per_step, b=budget, **intervals(steps)
            )
            total += wall
            runs.append(
                RunPlan(
                    name=name,
                    arm=arm.name,
                    seed=seed,
                    gpu=g,
                    order=order,
                    overrides=(
                        *arm.overrides,
                        f"training.seed={seed}",
                        f"training.train_iters={steps}",
                        f"training.warmup_iters={warmup}",
                        f"validation.interval={val_interval}",
                        f"validation.iters={val_iters}",
                        f"logging.telemetry_interval={telemetry_interval}",
                        f"checkpoint.save_interval={save_interval}",
                        "checkpoint.keep_last=1",
                        f"runtime.output_dir={output_root}/runs/{name}",
                    ),
                    tokens_per_s=tps_value[arm.name],
                    wall_s=wall,
                )
            )
        lane_s[g] = total
    for r in runs:  # every override must pass the trainer's own config checks here, not on the GPU
        load_config(REPO / config, list(r.overrides))
    session_s = budget.setup_s + max(lane_s.values()) + budget.final_s
    n_calls = max(1, math.ceil((session_s + budget.gap_s) / (budget.call_s + budget.gap_s)))
    calls = tuple(
        (
            k * (budget.call_s + budget.gap_s),
            min(k * (budget.call_s + budget.gap_s) + budget.call_s, session_s),
        )
        for k in range(n_calls)
    )
    return Plan(
        config=config,
        gpus=gpus,
        arms=arm_objs,
        seeds=tuple(seeds),
        runs=tuple(sorted(runs, key=lambda r: (r.gpu, r.order))),
        deferred=tuple((n, a.name, s) for n, a, s in deferred),
        train_iters=steps,
        tokens_per_step=tokens_per_step,
        warmup_iters=warmup,
        val_interval=val_interval,
        val_iters=val_iters,
        save_interval=save_interval,
        telemetry_interval=telemetry_interval,
        min_tokens=min_tokens,
        budget=budget,
        throughput=tps,
        lane_s=lane_s,
        session_s=session_s,
        stop_at_s=budget.hold_s - budget.start_s - budget.warm_s - budget.final_s,
        calls=calls,
        notes=tuple(notes),
    )


def resolution_lines(plan: Plan) -> list[str]:
    """Per non-baseline arm: the half-width of the final validation gap's t interval, as
    ``tools/compare_runs.py`` forms it: paired where the arm holds the baseline's seeds (in units of
    the s.d. of the per-seed differences), else Welch's (in seed s.d. units)."""
    sys.path.insert(0, str(REPO / "tools"))
    from runcompare.welch import paired_resolution_factor, resolution_factor

    seeds: dict[str, list[int]] = {}
    for r in plan.runs:
        seeds.setdefault(r.arm, []).append(r.seed)
    base = "bf16"
    if base not in seeds:
        return ["no bf16 arm: no gap to resolve"]
    out = []
    for arm in (a.name for a in plan.arms if a.name != base and a.name in seeds):
        n_a, n_b = len(seeds[arm]), len(seeds[base])
        if n_a >= 2 and sorted(seeds[arm]) == sorted(seeds[base]):
            k = paired_resolution_factor(n_a)
            out.append(
                f"{arm} - bf16: {n_a} paired seeds: half-width = {k:.2f} x the s.d. of the per-seed "
                "differences"
            )
        elif n_a < 2 or n_b < 2:
            out.append(f"{arm}: {n_a} vs {n_b} seeds: no interval over seeds (needs >= 2 per arm)")
        else:
            k = resolution_factor(n_a, n_b)
            out.append(f"{arm} - bf16: {n_a} vs {n_b} seeds (Welch): half-width = {k:.2f} x the seed s.d.")
    return out


def _dur(s: float) -> str:
    return f"{s:,.0f} s ({s / 60:.1f} min)"


def device_command(root: str) -> str:
    """The command of every device call (the same each time)."""
    return f"PYTHONUNBUFFERED=1 python3 bench/trajectory_session.py {shlex.quote(root)}"


def format_plan(plan: Plan, *, root: str, python: str = "python3") -> str:
    """The plan as text: runs per GPU, steps, tokens, timeline, calls, resolution and the commands."""
    b = plan.budget
    n_all = len(plan.runs) + len(plan.deferred)
    L = [
        f"trajectory plan: {plan.gpus} GPU(s), {len(plan.runs)} run(s) at once"
        + (f" ({n_all} asked, {len(plan.deferred)} deferred)" if plan.deferred else ""),
        f"config          {plan.config} + the overrides below; data.seed fixed (same batches, same order)",
        f"train_iters     {plan.train_iters:,} per run x {plan.tokens_per_step:,} tokens/step = "
        f"{plan.tokens:,} tokens per run (min {plan.min_tokens:,}: "
        + ("ok)" if plan.tokens >= plan.min_tokens else "NOT MET)"),
        f"warmup          {plan.warmup_iters} steps, cosine to min_lr over train_iters",
        f"validation      every {plan.val_interval} steps = {plan.val_interval * plan.tokens_per_step:,} "
        f"tokens; {plan.val_iters} batches = {plan.val_iters * plan.tokens_per_step:,} held-out tokens; "
        f"{plan.evals} evaluations",
        f"telemetry       every {plan.telemetry_interval} steps: max attention logit per layer, NVFP4 "
        "zero-scale-block fraction (nvfp4 Q/K arms)",
        f"checkpoints     every {plan.save_interval} steps, keep_last 1 (a lost process resumes from it)",
        "throughput      "
        + "; ".join(f"{a}: {v:,.0f} tokens/s/GPU ({src})" for a, (v, src) in plan.throughput.items()),
        f"margin          +{100 * b.margin:.0f}% on the step time; run start {b.run_start_s:g} s; "
        f"save {b.save_s:g} s each",
        "",
        "per GPU (runs of one GPU one after another; estimated wall clock):",
    ]
    for r in plan.runs:
        L.append(
            f"  GPU {r.gpu}  {r.name:<34} {plan.train_iters:,} steps  {plan.tokens / 1e6:,.1f}M tokens  "
            f"{_dur(r.wall_s)}"
        )
    for name, _arm, _seed in plan.deferred:
        L.append(f"  deferred {name}: run later with the command under 'deferred runs'")
    for n in plan.notes:
        L.append(f"note: {n}")
    calls = "; ".join(f"call {i + 1} {s:,.0f}-{e:,.0f} s" for i, (s, e) in enumerate(plan.calls))
    slowest = max(plan.lane_s.values())
    g_slow = max(plan.lane_s, key=plan.lane_s.get)
    margin_s = sum(
        plan.train_iters * plan.tokens_per_step / r.tokens_per_s * b.margin
        for r in plan.runs
        if r.gpu == g_slow
    )
    L += [
        "",
        f"timeline        machine start {b.start_s:g} s before call 1; set-up {b.setup_s:g} s; slowest GPU "
        f"{_dur(slowest)}; compare + pack {b.final_s:g} s: session {_dur(plan.session_s)} from call 1",
        f"device calls    {len(plan.calls)}, each up to {b.call_s:g} s (limit {DEVICE_CALL_LIMIT_S} s), "
        f"{b.gap_s:g} s apart (the machine goes back after {DEVICE_WARM_S} s idle): {calls}",
        f"device time     {b.start_s:g} + {plan.session_s:,.0f} + {b.warm_s:g} = {plan.device_s:,.0f} s of "
        f"{b.hold_s:g} s ({b.hold_s - plan.device_s:,.0f} s to spare besides the {margin_s:,.0f} s margin "
        f"on GPU {g_slow})",
        f"stop at         {plan.stop_at_s:,.0f} s after call 1 starts (runtime.exit_duration_mins at each "
        "launch): a slow run saves and stops in time for the compare",
        "resolution      95% t interval of the final validation gap (tools/compare_runs.py: paired where an "
        "arm holds bf16's seeds, else Welch's):",
        *(f"                {line}" for line in resolution_lines(plan)),
        "",
        f"device command  (nvidia-h200-x{plan.gpus}" if plan.gpus > 1 else "device command  (nvidia-h200",
    ]
    L[-1] += ", carry .whl and .gpudata, timeout_s 600; the same command every call):"
    L.append(f"  {device_command(root)}")
    L.append("each call prints its progress and ends with 'call again' or 'done'; the last writes the")
    L.append(f"comparison and packs {root}/runs/*/(metrics.jsonl, run_meta.json, train.log) into $OUT.")
    L += ["", "trainer commands (started detached on the machine, cwd = the private code copy):"]
    for r in plan.runs:
        argv = [python, "pretrain_llama.py", "--config", plan.config, *r.overrides, "data.corpus=<blend>"]
        L.append(f"  CUDA_VISIBLE_DEVICES={r.gpu} {shlex.join(argv)}")
    L.append(
        "  (data.corpus=<blend>: the prepared sources weighted by their train tokens, written into "
        "plan.json on the machine after the data preparation; runtime.exit_duration_mins added at launch)"
    )
    if plan.deferred:
        names = " ".join(n for n, _, _ in plan.deferred)
        L += [
            "",
            "deferred runs (a later session, same image, same train_iters; compare with the others after):",
            f"  {device_command(root)} --gpus 1 --runs {names} --train-iters {plan.train_iters}",
        ]
    return "\n".join(L)
