"""A stand-in for pretrain_llama.py in the session tests: the same command line (``--config PATH``
and dotted overrides), run directory files (run_meta.json, metrics.jsonl), checkpoint/resume (a
``checkpoint.json`` with the step), SIGTERM (save, exit 3), the time budget (save, exit 4) and a run
already finished (exit 0 at once). One step takes ``$FAKE_STEP_S`` seconds (default 0.01)."""

import json
import os
import signal
import sys
import time
from pathlib import Path

START = time.time()


def main(argv):
    over = dict(a.split("=", 1) for a in argv if "=" in a and not a.startswith("--"))
    iters = int(over["training.train_iters"])
    val_every = int(over["validation.interval"])
    save_every = int(over["checkpoint.save_interval"])
    out = Path(over["runtime.output_dir"])
    budget = float(over.get("runtime.exit_duration_mins", "1e9")) * 60
    seed = int(over["training.seed"])
    recipe = over["attention.recipe"]
    step_s = float(os.environ.get("FAKE_STEP_S", "0.01"))
    out.mkdir(parents=True, exist_ok=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    (out / "run_meta.json").write_text(
        json.dumps(
            {
                "config_fingerprint": "c0ffee",
                "data_order_fingerprint": "da7a",
                "seed": seed,
                "world_size": 1,
                "commit": os.environ.get("BENCH_COMMIT"),
                "config": {"attention": {"recipe": recipe}},
                "precision": {
                    "attention_recipe": recipe,
                    "attention_backend": "triton",
                    "projection": "bf16",
                },
                "env": {
                    "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "cache": os.environ.get("PRETRAIN_DATA_CACHE"),
                },
                "corpus": over.get("data.corpus"),
            }
        )
    )
    ckpt = out / "checkpoint.json"
    step = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
    with open(out / "metrics.jsonl", "a") as m:

        def rec(**r):
            m.write(json.dumps(r) + "\n")
            m.flush()

        rec(kind="event", step=step, event="resume" if step else "start", detail="fake")
        if step >= iters:
            rec(kind="event", step=step, event="exit", detail="done: already trained")
            return 0
        while step < iters:
            time.sleep(step_s)
            step += 1
            loss = 5.0 + 3.0 / step + (0.01 if recipe != "bf16" else 0.0) + 0.001 * seed
            rec(
                kind="train",
                step=step,
                consumed_samples=step * 32,
                consumed_tokens=step * 65536,
                loss=loss,
                grad_norm=1.0,
                lr=1e-3,
                step_time_s=step_s,
                tokens_per_s_per_gpu=2e5,
                mfu=0.1,
                peak_mem_gib=30.0,
                skipped=False,
                nonfinite_count=0,
            )
            if step % val_every == 0 or step == iters:
                rec(kind="valid", step=step, consumed_tokens=step * 65536, val_loss=loss + 0.5)
            code = 3 if stop else 4 if time.time() - START >= budget else None
            if step % save_every == 0 or step == iters or code:
                ckpt.write_text(json.dumps({"step": step}))
            if code:
                rec(kind="event", step=step, event="exit", detail=f"stopped ({code})")
                return code
        rec(kind="event", step=step, event="exit", detail="done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
