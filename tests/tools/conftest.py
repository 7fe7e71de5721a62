"""Synthetic run directories for the compare_runs tests (metrics.jsonl + run_meta.json, the format
the training job writes)."""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

SEQ = 1024
GLOBAL_BATCH = 8
TOKENS_PER_STEP = SEQ * GLOBAL_BATCH


def synth_losses(
    n_steps: int,
    *,
    gap,
    seed: int,
    salt: int = 0,
    data_seed: int = 1234,
    noise: float = 0.02,
    phi: float = 0.5,
    seed_offset_sd: float = 0.003,
) -> np.ndarray:
    """Train loss (nats) of one run at steps 1..n: a shared decaying curve, batch noise shared by every
    run (same data order), an AR(1) per-run noise, a small per-seed offset, plus ``gap`` (a number or
    an array over steps). ``salt`` separates the noise of runs that share a seed."""
    k = np.arange(1, n_steps + 1)
    shared = np.random.default_rng(data_seed)
    curve = 2.8 + 8.0 * np.exp(-k / 25.0) + 0.5 * np.exp(-k / 200.0)
    batch = shared.normal(0.0, 0.05, n_steps)
    rng = np.random.default_rng([10_000 + seed, salt])
    z = rng.normal(0.0, noise, n_steps)
    e = np.empty(n_steps)
    acc = 0.0
    for i in range(n_steps):
        acc = phi * acc + np.sqrt(1 - phi * phi) * z[i]
        e[i] = acc
    return curve + batch + e + rng.normal(0.0, seed_offset_sd) + np.asarray(gap, dtype=float)


def write_run(
    root: Path,
    name: str,
    *,
    recipe: str = "bf16",
    projection="bf16",
    seed: int = 0,
    losses: np.ndarray | None = None,
    n_steps: int = 400,
    gap=0.0,
    tokens_per_step: int = TOKENS_PER_STEP,
    val_every: int = 20,
    tps: float = 1000.0,
    config_fp: str = "c0ffee",
    data_fp: str = "da7a",
    commit: str | None = "abc1234",
    extra_lines: list[str] | None = None,
    nan_steps: tuple[int, ...] = (),
    seed_offset_sd: float = 0.003,
    config: dict | None = None,
    device: str = "gpu",
    data_content: str | None = None,
    layer_spec: str | None = None,
) -> Path:
    """Write a run directory ``root/name`` and return it. Train records at steps 1..n (consumed
    tokens = step * tokens_per_step), a validation record every ``val_every`` steps (val loss =
    the train loss curve + 0.1), events start/save/exit. ``nan_steps``: steps whose loss is NaN
    (skipped, nonfinite_count incremented). ``config``: the resolved config of run_meta.json (default
    a two-key stand-in). ``device``: ``gpu`` (backend triton, mfu logged) or ``cpu`` (backend
    reference, mfu null, as the trainer writes on a CPU). ``data_content``: run_meta.json's digest of
    the prepared files (None: not recorded, as before 2026-12-06); ``layer_spec``: the layer spec built
    (likewise)."""
    d = root / name
    d.mkdir(parents=True)
    if losses is None:
        losses = synth_losses(
            n_steps,
            gap=gap,
            seed=seed,
            salt=zlib.crc32(f"{recipe}{projection}".encode()),
            seed_offset_sd=seed_offset_sd,
        )
    n_steps = len(losses)
    meta = {
        "config_fingerprint": config_fp,
        "data_order_fingerprint": data_fp,
        "precision": {
            "attention_recipe": recipe,
            "attention_backend": "triton" if device == "gpu" else "reference",
            "projection": projection,
        },
        "seed": seed,
        "world_size": 8 if device == "gpu" else 1,
        "commit": commit,
        "config": config if config is not None else {"seq_length": SEQ, "global_batch_size": GLOBAL_BATCH},
    }
    if data_content is not None:  # run_meta.json of runs from 2026-12-06 on
        meta["data_content"] = data_content
    if layer_spec is not None:  # likewise
        meta["layer_spec"] = layer_spec
    (d / "run_meta.json").write_text(json.dumps(meta))
    lines = [json.dumps({"kind": "event", "step": 0, "event": "start", "detail": "fresh"})]
    nonfinite = 0
    rng = np.random.default_rng(99 + seed)
    for i, loss in enumerate(losses):
        step = i + 1
        bad = step in nan_steps
        nonfinite += bad
        lines.append(
            json.dumps(
                {
                    "kind": "train",
                    "step": step,
                    "consumed_samples": step * GLOBAL_BATCH,
                    "consumed_tokens": step * tokens_per_step,
                    "loss": float("nan") if bad else float(loss),
                    "grad_norm": None if bad else 1.0,
                    "lr": 3e-4,
                    "step_time_s": 0.1,
                    "tokens_per_s_per_gpu": float(tps * (1 + 0.01 * rng.standard_normal())),
                    "mfu": 0.3 if device == "gpu" else None,
                    "peak_mem_gib": 40.0,
                    "skipped": bad,
                    "nonfinite_count": nonfinite,
                }
            )
        )
        if step % val_every == 0:
            lines.append(
                json.dumps(
                    {
                        "kind": "valid",
                        "step": step,
                        "consumed_tokens": step * tokens_per_step,
                        "val_loss": float(loss) + 0.1 if not bad else float(losses[i - 1]) + 0.1,
                    }
                )
            )
        if step % 100 == 0:
            lines.append(json.dumps({"kind": "event", "step": step, "event": "save", "detail": "ckpt"}))
            lines.append(json.dumps({"kind": "telemetry", "step": step, "gpu_util": 0.9}))
    lines.append(json.dumps({"kind": "event", "step": n_steps, "event": "exit", "detail": "done"}))
    lines += extra_lines or []
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return d


@pytest.fixture
def make_run(tmp_path):
    def _make(name, **kw):
        return write_run(tmp_path, name, **kw)

    return _make
