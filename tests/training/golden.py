"""The golden-loss check of the main job: the embedded default (``configs/default.yaml``, the job
``python pretrain_llama.py`` runs) for :data:`STEPS` steps on a CPU, against the losses committed in
``tests/assets/losses/default_cpu.json`` (torchtitan keeps its golden losses the same way, in
``tests/assets/losses``).

    .venv/bin/python -m tests.training.golden --write     # re-record after an intended change

The run differs from the default job only where a test must: ``train_iters`` and ``warmup_iters``
(a :data:`STEPS`-step run, to keep CI short; the first step's loss is the default job's), validation
and checkpoints off, output under a temporary directory. The reference backend runs the attention on
a CPU (``backend: auto``). The file also holds the same run with the ``bf16`` recipe, so that the
test can show its tolerance resolves a change of the attention numerics (``test_golden_loss.py``).

The run's numerics are pinned (:data:`PINNED_ENV`, in a fresh process: MKL and ATen read these at
start): MKL's conditional numerical reproducibility in its ``COMPATIBLE`` code path, and ATen's CPU
kernels at AVX2. Unpinned, the losses depend on the machine: on a 2-core Sapphire Rapids VM
(2026-12-02) the first five differed from a file recorded on another CPU by up to 1.06e-3, and one
thread against two by up to 9.8e-4 on the same machine (an FP8 rounding flipped by a reordered sum
moves the first Adam steps far more than the reordering itself). Pinned, one and two threads and
ATen at AVX2 or AVX-512 gave the same losses bit for bit there.

Pinned is still not the same on every CPU: the file recorded at 3b34de8 (on that session's
machine) and a 2-core AMD EPYC without AVX-512 (2026-12-03) gave losses up to 3.5e-4 apart (step 5;
steps 1-4: 0, 7.6e-6, 1.8e-4, 6.6e-5), each reproducible bit for bit on its own machine. So the
file names the CPU class that recorded it (:func:`cpu_class`: vendor and whether it has AVX-512),
and the test holds a run on that class to its tight tolerance and a run elsewhere to a looser one
(``test_golden_loss.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

GOLDEN = Path(__file__).resolve().parents[1] / "assets" / "losses" / "default_cpu.json"
STEPS = 5
PINNED_ENV = {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "avx2"}


def overrides(output_dir: str | Path, *extra: str) -> list[str]:
    """The command-line overrides of the golden run (``extra`` last)."""
    return [
        f"training.train_iters={STEPS}",
        "training.warmup_iters=2",
        "validation.interval=0",
        "checkpoint.save=false",
        "checkpoint.load=none",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
        f"runtime.output_dir={output_dir}",
        *extra,
    ]


def cpu_class() -> str:
    """``"<vendor> avx512"`` or ``"<vendor> avx2"`` from /proc/cpuinfo (``platform.processor()`` as
    the vendor where that file does not exist): the classes between which the pinned losses were
    seen to differ (module docstring)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.processor() or 'unknown'} avx2"
    first = {}  # the first processor's fields: every core of one machine is the same class
    for line in lines:
        key, sep, value = line.partition(":")
        if sep:
            first.setdefault(key.strip(), value.strip())
    isa = "avx512" if "avx512f" in first.get("flags", "").split() else "avx2"
    return f"{first.get('vendor_id', 'unknown')} {isa}"


def run_losses(*extra: str, log=lambda _msg: None) -> dict[int, float]:
    """Train the golden run (with ``extra`` overrides) in this process; step -> training loss.

    Raises:
        RuntimeError: the run did not exit with code 0.
    """
    from training.config import load_config
    from training.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="golden_") as tmp:
        code = Trainer(load_config(None, overrides(tmp, *extra)), log=log).run()
        if code != 0:
            raise RuntimeError(f"the golden run exited with code {code}")
        with open(Path(tmp) / "metrics.jsonl") as f:
            records = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def run_pinned_losses(*extra: str) -> dict[int, float]:
    """:func:`run_losses` in a fresh process with :data:`PINNED_ENV` (module docstring); step ->
    training loss.

    Raises:
        RuntimeError: the process failed (its stderr's tail in the message).
    """
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, **PINNED_ENV, "PYTHONPATH": str(repo)}
    res = subprocess.run(
        [sys.executable, "-m", "tests.training.golden", "--json", *extra],
        env=env,
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if res.returncode != 0:
        raise RuntimeError(f"the pinned golden run failed (exit {res.returncode}): {res.stderr[-2000:]}")
    return {int(k): v for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()}


def read_golden() -> dict:
    """The committed file, with integer step keys in ``losses`` and ``bf16_losses``."""
    data = json.loads(GOLDEN.read_text())
    for key in ("losses", "bf16_losses"):
        data[key] = {int(k): v for k, v in data[key].items()}
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"record the pinned runs' losses into {GOLDEN}")
    p.add_argument("--json", action="store_true", help="this process's run; its losses as one JSON line")
    p.add_argument("extra", nargs="*", help="more overrides (with --json)")
    args = p.parse_args(argv)
    if args.json:
        print(json.dumps(run_losses(*args.extra)))
        return 0
    losses = run_pinned_losses()
    print(json.dumps(losses, indent=1))
    if args.write:
        bf16 = run_pinned_losses("attention.recipe=bf16")
        data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        data.update(
            cpu=cpu_class(),
            steps=STEPS,
            overrides=overrides("<tmp>"),
            losses={str(k): v for k, v in losses.items()},
            bf16_losses={str(k): v for k, v in bf16.items()},
        )
        GOLDEN.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
