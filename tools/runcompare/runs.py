"""Loading run directories, grouping runs into precision arms, aligning them on consumed tokens.

A run directory (``tools/rundir.py`` parses its files) holds ``metrics.jsonl`` (records of kind
train / valid / telemetry / event, appended across resumes: for each (kind, step) the last record
wins) and ``run_meta.json``. The files are untrusted data: every field that is used is type-checked
here. Units: tokens (consumed_tokens), nats (loss, val_loss), tokens/s/GPU (throughput).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rundir import META_FILE, METRICS_FILE, metrics_lines, parse_meta

from training.fingerprint import fingerprinted_keys
from training.records import relaunch_step

MAX_KEYS_LISTED = 12  # differing config keys named in a refusal


class CompareError(Exception):
    """The runs cannot be compared (or a file cannot be read); ``reasons`` lists why, one per item."""

    def __init__(self, reasons: list[str] | str):
        self.reasons = [reasons] if isinstance(reasons, str) else list(reasons)
        super().__init__("; ".join(self.reasons))

    def __str__(self) -> str:
        if len(self.reasons) == 1:
            return self.reasons[0]
        return "runs refused:\n" + "\n".join(f"  - {r}" for r in self.reasons)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# Fields read from each record kind and their check: (name, predicate, description).
_TRAIN_FIELDS = (
    ("step", _is_int, "int"),
    ("consumed_tokens", _is_int, "int"),
    ("loss", _is_num, "number"),
    ("tokens_per_s_per_gpu", _is_num, "number"),
    ("skipped", lambda v: isinstance(v, bool), "bool"),
    ("nonfinite_count", _is_int, "int"),
    ("grad_norm", lambda v: v is None or _is_num(v), "number or null"),
)
_VALID_FIELDS = (
    ("step", _is_int, "int"),
    ("consumed_tokens", _is_int, "int"),
    ("val_loss", _is_num, "number"),
)
_EVENT_FIELDS = (("event", lambda v: isinstance(v, str), "str"),)


@dataclass
class RunData:
    """One run: its metadata and its de-duplicated records as arrays sorted by step.

    ``train``: dict of 1-D arrays (length = train steps): ``step``, ``consumed_tokens`` (int64,
    tokens), ``loss`` (float64 nats; NaN/inf kept as logged), ``tokens_per_s_per_gpu``,
    ``skipped`` (bool), ``nonfinite_count`` (int64, cumulative), ``grad_norm`` (NaN where null).
    ``valid``: ``step``, ``consumed_tokens``, ``val_loss``.
    """

    path: Path
    name: str
    config_fingerprint: str
    data_order_fingerprint: str
    attention_recipe: str
    attention_backend: str
    projection: str  # canonical text: the string, or compact sorted JSON of an object
    seed: int
    world_size: int
    commit: str | None
    config: dict | None  # the resolved config of run_meta.json (None when it holds none)
    train: dict[str, np.ndarray]
    valid: dict[str, np.ndarray]
    events: Counter = field(default_factory=Counter)
    record_counts: Counter = field(default_factory=Counter)  # lines read per kind (before de-dup)
    n_replaced: int = 0  # records superseded by a later record of the same (kind, step)
    n_malformed: int = 0  # lines skipped with --skip-malformed
    on_gpu: bool = True  # some train record has a numeric mfu (the trainer logs MFU only on a GPU)
    qk_rotation: str = "none"  # the resolved config's attention.qk_rotation ("none" when absent)
    data_content: str | None = None  # run_meta.json's digest of the prepared files (None: not recorded)
    layer_spec: str | None = None  # "transformer_engine" or "local" as built (None: not recorded)
    lr: dict[int, float] = field(default_factory=dict)  # step -> the logged learning rate (where numeric)
    # (k, [[key, before, after], ...]) per config change allowed at a resume from step k that its kept
    # steps up to k predate (read_metrics)
    config_changes: list[tuple[int, list]] = field(default_factory=list)

    @property
    def arm(self) -> str:
        """Arm label: the precision of the run, ``attn=<recipe>[+<qk rotation>],proj=<projection>``."""
        return arm_label(self.attention_recipe, self.projection, self.qk_rotation)


def arm_label(recipe: str, projection: str, qk_rotation: str = "none") -> str:
    """Label of the arm with attention recipe ``recipe``, canonical projection text and Q/K rotation
    (``none`` adds nothing; ``hadamard`` gives ``attn=<recipe>+hadamard,...``)."""
    rot = "" if qk_rotation in (None, "none") else f"+{qk_rotation}"
    return f"attn={recipe}{rot},proj={projection}"


def _qk_rotation(config) -> str:
    """``attention.qk_rotation`` of a resolved config (``none`` when absent: runs from before the option)."""
    att = config.get("attention") if isinstance(config, dict) else None
    rot = att.get("qk_rotation", "none") if isinstance(att, dict) else "none"
    return rot if isinstance(rot, str) and rot else "none"


def _canonical_projection(p) -> str:
    """``"bf16"`` for BF16 projections (a string, or the trainer's ``projection`` section with
    ``precision: bf16``, whose FP8 settings do not apply); otherwise the precision followed by the
    compact sorted JSON of the remaining settings, e.g. ``te_fp8{"fp8_format":"hybrid",...}``."""
    if isinstance(p, str):
        return p
    if isinstance(p.get("precision"), str):
        if p["precision"] == "bf16":
            return "bf16"
        rest = {k: v for k, v in p.items() if k != "precision"}
        return p["precision"] + json.dumps(rest, sort_keys=True, separators=(",", ":"))
    return json.dumps(p, sort_keys=True, separators=(",", ":"))


def read_meta(run_dir: Path) -> dict:
    """Validated fields of ``run_dir/run_meta.json``; raises CompareError naming what is wrong."""
    path = run_dir / META_FILE
    if not path.is_file():
        raise CompareError(f"{run_dir}: no run_meta.json")
    try:
        meta = parse_meta(run_dir)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CompareError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise CompareError(f"{path}: cannot be read ({e.strerror})") from None
    if not isinstance(meta, dict):
        raise CompareError(f"{path}: top level is not an object")
    errs = []

    def need(obj, key, pred, desc, where):
        if key not in obj:
            errs.append(f"{path}: missing {where}{key}")
        elif not pred(obj[key]):
            errs.append(f"{path}: {where}{key} must be {desc}, got {type(obj[key]).__name__}")

    need(meta, "config_fingerprint", lambda v: isinstance(v, str) and v, "a non-empty string", "")
    need(meta, "data_order_fingerprint", lambda v: isinstance(v, str) and v, "a non-empty string", "")
    need(meta, "seed", _is_int, "an int", "")
    need(meta, "world_size", lambda v: _is_int(v) and v > 0, "a positive int", "")
    need(meta, "commit", lambda v: v is None or isinstance(v, str), "a string or null", "")
    need(meta, "precision", lambda v: isinstance(v, dict), "an object", "")
    prec = meta.get("precision")
    if isinstance(prec, dict):
        need(prec, "attention_recipe", lambda v: isinstance(v, str) and v, "a non-empty string", "precision.")
        need(prec, "attention_backend", lambda v: isinstance(v, str), "a string", "precision.")
        need(prec, "projection", lambda v: isinstance(v, (str, dict)), "a string or an object", "precision.")
    if errs:
        raise CompareError(errs)
    return meta


def read_metrics(run_dir: Path, *, skip_malformed: bool = False):
    """Parse ``run_dir/metrics.jsonl``.

    Returns ``(train, valid, events, record_counts, n_replaced, n_malformed, changes)`` where
    ``train`` and ``valid`` map step -> record (the last record of that kind and step wins, and a
    ``resume`` event at step k drops the records of later steps read before it, a fresh ``start``
    all of them: :func:`training.records.relaunch_step`), and ``changes`` lists ``(k, [[key, before,
    after], ...])`` for each resume at step k, among the launches kept, that a config change was
    allowed at (``allowed_changes``): the kept steps up to k were trained under the values before.
    A malformed line (bad JSON, not an object, a used field missing or of the wrong type) raises
    CompareError with its line number, or is counted and skipped with ``skip_malformed``. Unknown
    kinds are counted.
    """
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise CompareError(f"{run_dir}: no metrics.jsonl")
    train: dict[int, dict] = {}
    valid: dict[int, dict] = {}
    events: Counter = Counter()
    counts: Counter = Counter()
    replaced = malformed = 0
    changes: list[tuple[int, list]] = []
    try:
        lines = list(metrics_lines(run_dir))
    except OSError as e:
        raise CompareError(f"{path}: cannot be read ({e.strerror})") from None
    for lineno, rec, problem in lines:
        if problem is None:
            problem = _field_problem(rec)
        if problem is not None:
            if skip_malformed:
                malformed += 1
                continue
            raise CompareError(
                f"{path}:{lineno}: {problem} (pass --skip-malformed to skip and count such lines)"
            )
        kind = rec.get("kind")
        counts[kind if isinstance(kind, str) else repr(kind)] += 1
        if kind == "train":
            replaced += rec["step"] in train
            train[rec["step"]] = rec
        elif kind == "valid":
            replaced += rec["step"] in valid
            valid[rec["step"]] = rec
        elif kind == "event":
            events[rec["event"]] += 1
            if (at := relaunch_step(rec)) is not None:
                # the relaunch trains the steps after its checkpoint again; after a rollback or a fresh
                # start they are the abandoned run's (found in review, 2026-12-06: they were read as
                # the run's)
                for records in (train, valid):
                    for step in [s for s in records if s > at]:
                        del records[step]
                        replaced += 1
                changes = [c for c in changes if c[0] < at]
                if rec.get("allowed_changes"):
                    changes.append((at, rec["allowed_changes"]))
    return train, valid, events, counts, replaced, malformed, changes


def _field_problem(rec: dict) -> str | None:
    """Why a record's used fields are missing or of the wrong type (the first one found), or None."""
    kind = rec.get("kind")
    fields = {"train": _TRAIN_FIELDS, "valid": _VALID_FIELDS, "event": _EVENT_FIELDS}.get(kind, ())
    for key, pred, desc in fields:
        if key not in rec:
            return f"{kind} record without {key!r}"
        if not pred(rec[key]):
            return f"{kind} record: {key!r} must be {desc}, got {type(rec[key]).__name__}"
    if kind == "event" and not _is_changes(rec.get("allowed_changes", [])):
        return "event record: 'allowed_changes' must be a list of [key, value before, value after]"
    return None


def _is_changes(v) -> bool:
    return isinstance(v, list) and all(
        isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and c[0] for c in v
    )


def _as_arrays(records: dict[int, dict], fields: tuple) -> dict[str, np.ndarray]:
    steps = sorted(records)
    out = {}
    for key, _, desc in fields:
        vals = [records[s][key] for s in steps]
        if desc == "int":
            out[key] = np.array(vals, dtype=np.int64)
        elif desc == "bool":
            out[key] = np.array(vals, dtype=bool)
        else:
            out[key] = np.array([math.nan if v is None else float(v) for v in vals], dtype=np.float64)
    return out


def load_run(run_dir: str | Path, *, skip_malformed: bool = False) -> RunData:
    """Read one run directory into a :class:`RunData` (records de-duplicated, sorted by step)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CompareError(f"{run_dir}: not a directory")
    meta = read_meta(run_dir)
    train, valid, events, counts, replaced, malformed, changes = read_metrics(
        run_dir, skip_malformed=skip_malformed
    )
    if not train:
        raise CompareError(f"{run_dir}: metrics.jsonl has no train records")
    prec = meta["precision"]
    return RunData(
        path=run_dir,
        name=run_dir.name,
        config_fingerprint=meta["config_fingerprint"],
        data_order_fingerprint=meta["data_order_fingerprint"],
        attention_recipe=prec["attention_recipe"],
        attention_backend=prec["attention_backend"],
        projection=_canonical_projection(prec["projection"]),
        seed=meta["seed"],
        world_size=meta["world_size"],
        commit=meta["commit"],
        config=meta["config"] if isinstance(meta.get("config"), dict) else None,
        data_content=meta["data_content"] if isinstance(meta.get("data_content"), str) else None,
        layer_spec=meta["layer_spec"] if isinstance(meta.get("layer_spec"), str) else None,
        lr={step: float(rec["lr"]) for step, rec in train.items() if _is_num(rec.get("lr"))},
        config_changes=[(k, c) for k, c in changes if any(s <= k for s in train)],
        train=_as_arrays(train, _TRAIN_FIELDS),
        valid=_as_arrays(valid, _VALID_FIELDS),
        events=events,
        record_counts=counts,
        n_replaced=replaced,
        n_malformed=malformed,
        on_gpu=any(_is_num(rec.get("mfu")) for rec in train.values()),
        qk_rotation=_qk_rotation(meta.get("config")),
    )


def unique_names(runs: list[RunData]) -> None:
    """Make ``run.name`` unique (the directory name, or parent/name where names collide)."""
    seen = Counter(r.name for r in runs)
    for r in runs:
        if seen[r.name] > 1:
            r.name = f"{r.path.parent.name}/{r.path.name}"
    seen = Counter(r.name for r in runs)
    for r in runs:
        if seen[r.name] > 1:
            r.name = str(r.path)


def check_fingerprints(runs: list[RunData], *, force: bool) -> list[str]:
    """Refuse runs whose config or data-order fingerprints differ, or whose recorded data contents
    (``data_content``) or layer specs (``layer_spec``) differ, unless ``force``; a run without
    ``data_content`` among runs with one is a warning (runs without ``layer_spec`` are not checked).

    Returns warnings (the overridden refusals when forced); raises CompareError otherwise.
    """
    reasons = []
    for attr, what in (("config_fingerprint", "config"), ("data_order_fingerprint", "data order")):
        groups: dict[str, list[str]] = {}
        for r in runs:
            groups.setdefault(getattr(r, attr), []).append(r.name)
        if len(groups) > 1:
            detail = "; ".join(f"{fp}: {', '.join(names)}" for fp, names in groups.items())
            keys = f"; {config_differences(runs)}" if attr == "config_fingerprint" else ""
            reasons.append(f"{what} fingerprints differ ({detail}){keys}")
    warnings = []
    recorded = _names_by(runs, "data_content")
    unrecorded = [r.name for r in runs if r.data_content is None]
    if len(recorded) > 1:  # the same paths, other files: a corpus prepared again between the runs
        detail = "; ".join(f"{c[:16]}: {', '.join(names)}" for c, names in recorded.items())
        reasons.append(
            f"the prepared data differ ({detail}): the corpus at the same prefixes was prepared again "
            "or replaced between the runs (data_content in run_meta.json)"
        )
    elif recorded and unrecorded:
        warnings.append(
            f"run_meta.json of {', '.join(unrecorded)} records no data_content (runs "
            "before 2026-12-06): that the prepared files are the same as the others' is not checked"
        )
    specs = _names_by(runs, "layer_spec")
    if len(specs) > 1:  # found in review, 2026-12-06: the config fingerprint holds transformer_impl=auto
        detail = "; ".join(f"{spec}: {', '.join(names)}" for spec, names in specs.items())
        reasons.append(
            f"the layer specs differ ({detail}): model.transformer_impl=auto built Transformer Engine's "
            "layers where TE was importable and megatron-core's local ones elsewhere; run every arm with "
            "the same model.transformer_impl=transformer_engine or local"
        )
    if reasons and not force:
        raise CompareError([f"{r} (pass --force to compare anyway)" for r in reasons])
    return warnings + [f"forced: {r}" for r in reasons]


def _names_by(runs: list[RunData], attr: str) -> dict[str, list[str]]:
    """The runs' names grouped by their recorded ``attr`` (runs where it is None left out)."""
    groups: dict[str, list[str]] = {}
    for r in runs:
        if getattr(r, attr) is not None:
            groups.setdefault(getattr(r, attr), []).append(r.name)
    return groups


def check_config_changes(runs: list[RunData], *, force: bool) -> list[str]:
    """Refuse runs whose kept steps were trained under two configs, unless ``force``: a change
    allowed at a resume (``checkpoint.allow_config_change``, recorded in the resume event's
    ``allowed_changes``), whose earlier steps ``run_meta.json`` (the last launch's) does not describe
    (found in review, 2026-12-06: a ``data.seed`` changed at a resume from step 10 compared silently,
    steps 1-10 on another sample order than every other run's). Returns the overridden refusals when
    forced."""
    reasons = []
    for r in runs:
        for at, changes in r.config_changes:
            what = ", ".join(f"{key} {_value_text(was)} -> {_value_text(now)}" for key, was, now in changes)
            reasons.append(
                f"{r.name}: its steps 1-{at} were trained under another config than its later steps and "
                f"its run_meta.json ({what}, allowed at its resume from step {at} by "
                "checkpoint.allow_config_change)"
            )
    if reasons and not force:
        raise CompareError([f"{x} (pass --force to compare anyway)" for x in reasons])
    return [f"forced: {x}" for x in reasons]


def check_learning_rates(runs: list[RunData], *, force: bool) -> list[str]:
    """Refuse runs whose logged learning rates differ at a step they share, unless ``force``: the
    same config fingerprint with another LR means a change allowed on a resume
    (``checkpoint.allow_config_change``), which ``run_meta.json`` (rewritten at every launch) does
    not show (found in review, 2026-12-06: a run rescued with a lower LR was compared silently, its
    LR's effect reported as precision's). Returns the overridden refusal when forced."""
    common = set.intersection(*(set(r.lr) for r in runs)) if runs else set()
    for step in sorted(common):
        values = {r.name: r.lr[step] for r in runs}
        lo, hi = min(values.values()), max(values.values())
        if hi - lo > 1e-9 * max(abs(hi), abs(lo), 1e-30):
            detail = ", ".join(f"{name} {v:.6g}" for name, v in values.items())
            why = (
                "a config change allowed on a resume (checkpoint.allow_config_change) that run_meta.json "
                "does not show"
                if len({r.config_fingerprint for r in runs}) == 1
                else "their configs differ (the config fingerprints)"
            )
            reason = f"the logged learning rates differ from step {step} on ({detail}): {why}"
            if not force:
                raise CompareError(f"{reason} (pass --force to compare anyway)")
            return [f"forced: {reason}"]
    return []


def _value_text(v) -> str:
    text = json.dumps(v, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= 60 else text[:57] + "..."


def config_differences(runs: list[RunData]) -> str:
    """Which fingerprinted keys of the runs' resolved configs (``run_meta.json``) differ, with the
    value in each run: ``keys that differ: training.lr (0.0003 in a, c; 0.001 in b), ...``."""
    missing = [r.name for r in runs if r.config is None]
    if missing:
        return f"run_meta.json of {', '.join(missing)} holds no config, so the differing keys cannot be named"
    flat = {r.name: fingerprinted_keys(r.config) for r in runs}
    absent = object()
    diffs = []
    for key in sorted(set().union(*flat.values())):
        by_value: dict[str, list[str]] = {}
        for r in runs:
            v = flat[r.name].get(key, absent)
            by_value.setdefault("(absent)" if v is absent else _value_text(v), []).append(r.name)
        if len(by_value) > 1:
            values = "; ".join(f"{v} in {', '.join(names)}" for v, names in by_value.items())
            diffs.append(f"{key} ({values})")
    if not diffs:
        return (
            "no fingerprinted key of the configs differs: the fingerprints were computed with another "
            "key list (training/fingerprint.py of another commit); compare the configs in run_meta.json"
        )
    more = f", and {len(diffs) - MAX_KEYS_LISTED} more" if len(diffs) > MAX_KEYS_LISTED else ""
    return "keys that differ: " + ", ".join(diffs[:MAX_KEYS_LISTED]) + more


def group_arms(runs: list[RunData], *, force: bool) -> tuple[dict[str, list[RunData]], list[str]]:
    """Group runs by precision arm (attention recipe + Q/K rotation + projection), sorted by seed
    within an arm.

    Two runs of one arm with the same seed are refused unless ``force``. One arm (all runs of one
    precision, several seeds) is allowed: the comparison then reports the seed spread alone.
    Returns ``(arms, warnings)``.
    """
    arms: dict[str, list[RunData]] = {}
    for r in runs:
        arms.setdefault(r.arm, []).append(r)
    warnings, reasons = [], []
    for label, members in arms.items():
        members.sort(key=lambda r: (r.seed, r.name))
        dup = [s for s, c in Counter(r.seed for r in members).items() if c > 1]
        for s in dup:
            names = ", ".join(r.name for r in members if r.seed == s)
            msg = f"arm {label} has more than one run with seed {s} ({names})"
            (warnings if force else reasons).append(f"forced: {msg}" if force else f"{msg} (pass --force)")
    if reasons:
        raise CompareError(reasons)
    return arms, warnings


def pick_baseline(arms: dict[str, list[RunData]], baseline: str | None) -> str:
    """Label of the baseline arm: ``baseline`` (an arm label, or an attention recipe naming exactly
    one arm), or by default the arm with attention recipe ``bf16`` and projection ``bf16`` (the only
    arm, when there is one)."""
    labels = list(arms)
    if baseline is None and len(arms) == 1:
        return labels[0]
    if baseline is None:
        want = arm_label("bf16", "bf16")
        if want not in arms:
            raise CompareError(
                f"no default baseline arm {want}; arms are {', '.join(labels)}; pass --baseline"
            )
        return want
    if baseline in arms:
        return baseline
    hits = [lab for lab, rs in arms.items() if rs[0].attention_recipe == baseline]
    if len(hits) == 1:
        return hits[0]
    why = "matches several arms" if hits else "matches no arm"
    raise CompareError(f"--baseline {baseline!r} {why}; arms are {', '.join(labels)}")


def _grid_reasons(
    runs: list[RunData], kind: str, grids: list[np.ndarray], hint: int | None = None
) -> list[str]:
    """Reasons why the token grids (one int array per run) of ``kind`` records differ. ``hint``: the
    ``--max-tokens`` to suggest for differing ranges (default: the common range of these grids)."""
    ref_run, ref = runs[0], grids[0]
    reasons = []
    for r, g in zip(runs[1:], grids[1:]):
        if np.array_equal(g, ref):
            continue
        n = min(len(g), len(ref))
        diff = np.nonzero(g[:n] != ref[:n])[0]
        if diff.size:
            i = int(diff[0])
            reasons.append(
                f"{kind} token grids differ: {ref_run.name} has consumed_tokens={int(ref[i])} at its "
                f"{kind} record #{i}, {r.name} has {int(g[i])} (different global batch, sequence length "
                f"or logging interval?)"
            )
        else:
            end_ref = int(ref[-1]) if len(ref) else 0
            end_g = int(g[-1]) if len(g) else 0
            reasons.append(
                f"{kind} token ranges differ: {ref_run.name} ends at {end_ref} tokens ({len(ref)} records), "
                f"{r.name} at {end_g} ({len(g)} records); pass --max-tokens "
                f"{min(end_ref, end_g) if hint is None else hint} to compare the common range"
            )
    return reasons


@dataclass
class Aligned:
    """Runs aligned on one token grid.

    ``tokens``: (n_steps,) int64 consumed tokens of the train grid; ``loss[name]``: (n_steps,)
    float64 train loss of each run (as logged, non-finite included); ``val_tokens``: (n_val,) and
    ``val_loss[name]``: (n_val,) likewise for validation (n_val may be 0).
    """

    tokens: np.ndarray
    loss: dict[str, np.ndarray]
    val_tokens: np.ndarray
    val_loss: dict[str, np.ndarray]
    train_mask: dict[str, np.ndarray]  # per run: which of its train records lie in the range
    max_tokens: int | None


def align(runs: list[RunData], *, max_tokens: int | None = None) -> Aligned:
    """Align runs on consumed tokens, keeping records with ``consumed_tokens <= max_tokens``.

    Train (and validation) records of every run must sit at exactly the same consumed_tokens
    values: misaligned grids (another global batch or sequence length, a different range) are
    refused with a reason -- never interpolated, even with --force, because different per-step
    batches would make the paired per-step gap meaningless. Within a run consumed_tokens must
    increase with step.
    """
    reasons = []
    for r in runs:
        for kind, arrs in (("train", r.train), ("valid", r.valid)):
            t = arrs["consumed_tokens"]
            if t.size > 1 and np.any(np.diff(t) <= 0):
                i = int(np.nonzero(np.diff(t) <= 0)[0][0])
                reasons.append(
                    f"{r.name}: {kind} consumed_tokens do not increase with step "
                    f"(step {int(arrs['step'][i])}: {int(t[i])}, "
                    f"step {int(arrs['step'][i + 1])}: {int(t[i + 1])})"
                )
    if reasons:
        raise CompareError(reasons)

    def clip(arrs):
        t = arrs["consumed_tokens"]
        return np.ones(t.shape, bool) if max_tokens is None else t <= max_tokens

    masks = {r.name: clip(r.train) for r in runs}
    vmasks = {r.name: clip(r.valid) for r in runs}
    grids = [r.train["consumed_tokens"][masks[r.name]] for r in runs]
    vgrids = [r.valid["consumed_tokens"][vmasks[r.name]] for r in runs]
    if any(g.size == 0 for g in grids):
        empty = [r.name for r, g in zip(runs, grids) if g.size == 0]
        raise CompareError(f"no train records at or below --max-tokens {max_tokens} in {', '.join(empty)}")
    train_reasons = _grid_reasons(runs, "train", grids)
    # one --max-tokens for both kinds: where the train ranges differ, their common end (validation
    # records lie on train steps; found in review, 2026-12-06: a torn run got two different hints)
    hint = min(int(g[-1]) for g in grids) if train_reasons else None
    reasons = train_reasons + _grid_reasons(runs, "valid", vgrids, hint)
    if reasons:
        raise CompareError(reasons)
    return Aligned(
        tokens=grids[0],
        loss={r.name: r.train["loss"][masks[r.name]] for r in runs},
        val_tokens=vgrids[0],
        val_loss={r.name: r.valid["val_loss"][vmasks[r.name]] for r in runs},
        train_mask=masks,
        max_tokens=max_tokens,
    )
