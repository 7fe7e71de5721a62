"""The resolved config and its fingerprint: the validated config as plain JSON-able data (what a run
saves in ``run_meta.json`` and every checkpoint's ``config.json``, and what resume compares), and
the sha256 of the keys that define *what* is trained (``tools/compare_runs.py`` groups runs by it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from .config import CONFIG_SECTIONS, TrainConfig

__all__ = [
    "FINGERPRINT_EXCLUDED",
    "canonical_json",
    "config_fingerprint",
    "flatten",
    "key_matches",
    "resolved_dict",
]


def resolved_dict(cfg: TrainConfig) -> dict:
    """The resolved config as plain JSON-able data (see the module docstring)."""
    out = {}
    for name in CONFIG_SECTIONS:
        section = getattr(cfg, name)
        if name == "model":
            base = dataclasses.asdict(section.llama_base())
            base.pop("attention"), base.pop("projection")
            out[name] = {"preset": section.preset, **base}
        else:
            out[name] = json.loads(json.dumps(dataclasses.asdict(section)))
    out["training"]["train_iters"] = cfg.train_iters
    return out


# Keys that do not define *what* is trained (precision, seed of the init, bookkeeping): removed from
# the config fingerprint so that runs differing only in precision (or seed) compare as the same job.
FINGERPRINT_EXCLUDED = (
    "attention.recipe",
    "attention.backend",
    "attention.options",
    "projection.*",
    "training.seed",
    "checkpoint.*",
    "logging.*",
    "runtime.output_dir",
    "runtime.exit_duration_mins",
)


def _flatten(d: dict, prefix: str = "") -> dict:
    flat = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


def flatten(d: dict) -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    return _flatten(d)


def key_matches(key: str, pattern: str) -> bool:
    """``pattern`` is a full key, ``section.*`` or a bare section name."""
    if pattern.endswith(".*"):
        return key.startswith(pattern[:-1])
    return key == pattern or key.startswith(pattern + ".")


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True)


def config_fingerprint(resolved: dict) -> str:
    """sha256 hex of the canonical JSON of ``resolved`` without :data:`FINGERPRINT_EXCLUDED`."""
    kept = {
        k: v for k, v in flatten(resolved).items() if not any(key_matches(k, p) for p in FINGERPRINT_EXCLUDED)
    }
    return hashlib.sha256(canonical_json(kept).encode()).hexdigest()
