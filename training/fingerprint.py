"""The config fingerprint: the sha256 of the resolved-config keys that define *what* is trained.

Runs that differ only in precision, init seed or bookkeeping (checkpointing, logging, output
directory, time budget) share it; ``tools/compare_runs.py`` refuses to compare runs whose
fingerprints differ and names the keys that differ (:func:`fingerprinted_keys`). No heavy imports
(no torch): the comparison tool reads run directories with it on any machine.
"""

from __future__ import annotations

import hashlib
import json

__all__ = [
    "FINGERPRINT_EXCLUDED",
    "canonical_json",
    "config_fingerprint",
    "fingerprinted_keys",
    "flatten",
    "key_matches",
]

# Keys that do not define *what* is trained (precision, seed of the init, bookkeeping): removed from
# the config fingerprint so that runs differing only in precision (or seed) compare as the same job.
FINGERPRINT_EXCLUDED = (
    "attention.recipe",
    "attention.backend",
    "attention.options",
    "attention.qk_rotation",
    "attention.qk_rotation_seed",
    "attention.qk_rotation_signs",
    "attention.fuse_rope",
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


def fingerprinted_keys(resolved: dict) -> dict:
    """The flattened keys of a resolved config (``{"training.lr": 0.0003, ...}``) that enter the
    fingerprint: all but :data:`FINGERPRINT_EXCLUDED`."""
    return {
        k: v for k, v in flatten(resolved).items() if not any(key_matches(k, p) for p in FINGERPRINT_EXCLUDED)
    }


def config_fingerprint(resolved: dict) -> str:
    """sha256 hex of the canonical JSON of ``resolved`` without :data:`FINGERPRINT_EXCLUDED`."""
    return hashlib.sha256(canonical_json(fingerprinted_keys(resolved)).encode()).hexdigest()
