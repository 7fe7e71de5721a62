"""The resolved config and its fingerprint: the validated config as plain JSON-able data (what a run
saves in ``run_meta.json`` and every checkpoint's ``config.json``, and what resume compares), and
the sha256 of the keys that define *what* is trained (``tools/compare_runs.py`` groups runs by it;
defined in :mod:`training.fingerprint`, re-exported here).

With a Q/K rotation (``attention.qk_rotation: hadamard``) the resolved config also records
``attention.qk_rotation_signs``, the sign vector at the model's head dim as ``+``/``-`` text: the
rotation itself, not only its seed, is compared on resume.
"""

from __future__ import annotations

import dataclasses
import json

from .config import CONFIG_SECTIONS, TrainConfig
from .fingerprint import FINGERPRINT_EXCLUDED, canonical_json, config_fingerprint, flatten, key_matches

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
    signs = cfg.attention.qk_rotation_signs(cfg.llama().head_dim)
    if signs is not None:  # the rotation itself, so that a resume checks it is the same H
        out["attention"]["qk_rotation_signs"] = signs
    return out
