"""Detached per-GPU lanes: the processes that run the trainers across device calls.

A lane (``trajectory_session.py ROOT --lane G``, started with ``setsid`` so that it outlives the
call that started it) runs the runs of GPU ``G`` one after another, each as its own trainer process
with ``CUDA_VISIBLE_DEVICES=G``, its own megatron index cache and ``runtime.exit_duration_mins`` =
the time left until the plan's stop time. A SIGTERM to the lane is passed to its trainer (which
finishes its step, saves and exits 3) and ends the lane.

Files under ``ROOT`` (the only state; every call reads them afresh):

* ``plan.json``: the frozen plan (written by the first call after its set-up);
* ``status/<run>.json``: ``state`` (``pending``, ``running``, ``done`` = exit 0, ``budget`` = the
  time budget was reached (exit 4), ``preempted`` = exit 3, ``failed`` = any other exit, ``no_time``
  = not started, the stop time had passed), ``exit_code``, ``pid`` of the trainer, ``launches``,
  ``started`` / ``ended`` (epoch seconds);
* ``lanes/gpu<G>.pid`` / ``.log``: the lane's process id and its own log;
* ``runs/<run>/``: the run directory (``metrics.jsonl``, ``run_meta.json``, ``train.log`` = the
  trainer's console output, appended over launches, ``checkpoints/``).

A run that is neither final nor running when a lane reaches it (its process was lost) is launched
again: ``checkpoint.load=auto`` resumes it from its last checkpoint (a finished one exits 0 at once).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

FINAL = ("done", "budget", "failed", "no_time")
EXIT_STATES = {0: "done", 3: "preempted", 4: "budget"}
PACK_NAME = "trajectory.tgz"
PACK_LIMIT = 15 * 1024**2  # the device returns files of at most 16 MiB


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_json(path: Path, obj: dict) -> None:
    """Write ``obj`` to ``path`` atomically (a reader sees the old or the new file)."""
    write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def status_path(root: Path, name: str) -> Path:
    return root / "status" / f"{name}.json"


def run_status(root: Path, name: str) -> dict:
    return read_json(status_path(root, name)) or {"state": "pending", "launches": 0}


def pid_alive(pid: int | None, needle: str | None = None) -> bool:
    """Whether process ``pid`` exists (and its command line contains ``needle``, where given)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if needle is None:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return True  # no /proc: trust the pid
    # empty while the process is inside a vfork (spawning its own child): it is the same process
    return not cmdline or needle in cmdline


def lane_pid_path(root: Path, gpu: int) -> Path:
    return root / "lanes" / f"gpu{gpu}.pid"


def lane_alive(root: Path, gpu: int) -> bool:
    try:
        pid = int(lane_pid_path(root, gpu).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return pid_alive(pid, "--lane")


def start_lane(root: Path, gpu: int, plan: dict) -> int:
    """Start the lane of ``gpu`` detached (its own session), from the plan's code copy; its pid."""
    code = Path(plan["code_root"])
    log = open(root / "lanes" / f"gpu{gpu}.log", "a")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(
        [plan["python"], str(code / "bench" / "trajectory_session.py"), str(root), "--lane", str(gpu)],
        cwd=code,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log.close()
    write_text(lane_pid_path(root, gpu), f"{proc.pid}\n")  # now: a second look must not start another
    return proc.pid


def trainer_env(plan: dict, run_dir: Path, gpu: int) -> dict:
    """The trainer's environment: ours without rank variables, its GPU, its own index cache, the
    carried packages first on the path, the commit of the tree it came from."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        CUDA_VISIBLE_DEVICES=str(gpu),
        PRETRAIN_DATA_CACHE=str(run_dir / "data_cache"),
        PYTHONUNBUFFERED="1",
    )
    if plan.get("site"):
        env["PYTHONPATH"] = os.pathsep.join([plan["site"], *filter(None, [os.environ.get("PYTHONPATH")])])
    if plan.get("commit"):
        env["BENCH_COMMIT"] = plan["commit"]
    return env


def trainer_argv(plan: dict, run: dict, now: float) -> list[str]:
    """The trainer command of ``run``: the plan's overrides, the blend, the time left as the budget."""
    left_min = max(0.05, (plan["session_start"] + plan["stop_at_s"] - now) / 60.0)
    corpus = [f"data.corpus={json.dumps(plan['corpus'])}"] if plan.get("corpus") else []
    return [
        *plan["trainer_argv"],
        "--config",
        plan["config"],
        *run["overrides"],
        *corpus,
        f"runtime.exit_duration_mins={left_min:.3f}",
    ]


class _Lane:
    def __init__(self, root: Path, gpu: int):
        self.root, self.gpu = root, gpu
        self.child: subprocess.Popen | None = None
        self.stopping = False

    def on_term(self, signum, frame):
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] lane gpu {self.gpu} (pid {os.getpid()}): {msg}", flush=True)

    def run(self) -> int:
        plan = read_json(self.root / "plan.json")
        if plan is None:
            self.log("no plan.json")
            return 2
        write_text(lane_pid_path(self.root, self.gpu), f"{os.getpid()}\n")
        signal.signal(signal.SIGTERM, self.on_term)
        mine = sorted((r for r in plan["runs"] if r["gpu"] == self.gpu), key=lambda r: r["order"])
        for run in mine:
            while not self.stopping:
                st = run_status(self.root, run["name"])
                if st["state"] in FINAL:
                    break
                if st.get("pid") and pid_alive(st["pid"], "pretrain") and st["state"] == "running":
                    self.log(f"{run['name']}: its trainer {st['pid']} still runs (an earlier lane); waiting")
                    while pid_alive(st["pid"], "pretrain") and not self.stopping:
                        time.sleep(2)
                    continue  # launch again: a finished run exits 0 at once, a cut one resumes
                self.launch(plan, run, st)
            if self.stopping:
                break
        return 0

    def launch(self, plan: dict, run: dict, st: dict) -> None:
        name, now = run["name"], time.time()
        if now >= plan["session_start"] + plan["stop_at_s"]:
            write_json(status_path(self.root, name), {**st, "state": "no_time", "ended": now})
            self.log(f"{name}: not started, the plan's stop time has passed")
            return
        run_dir = Path(run["output_dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        argv = trainer_argv(plan, run, now)
        with open(run_dir / "train.log", "a") as log:
            log.write(f"\n[trajectory_session] launch {st.get('launches', 0) + 1}: {' '.join(argv)}\n")
            log.flush()
            self.child = subprocess.Popen(
                argv,
                cwd=plan["code_root"],
                env=trainer_env(plan, run_dir, self.gpu),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        launches = st.get("launches", 0) + 1
        write_json(
            status_path(self.root, name),
            {"state": "running", "pid": self.child.pid, "launches": launches, "started": now},
        )
        self.log(f"{name}: launch {launches}, pid {self.child.pid}")
        code = self.child.wait()
        self.child = None
        state = EXIT_STATES.get(code, "failed")
        write_json(
            status_path(self.root, name),
            {"state": state, "exit_code": code, "launches": launches, "started": now, "ended": time.time()},
        )
        self.log(f"{name}: exit {code} ({state})")
        if state == "preempted" and not self.stopping:
            self.log(f"{name}: a SIGTERM from outside the lane; launching it again resumes it")


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a reader never sees a half-written pid file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def lane_main(root: Path, gpu: int) -> int:
    """The ``--lane`` entry point."""
    return _Lane(root, gpu).run()


# ------------------------------------------------------------------------------ progress and packing


def last_records(metrics: Path, tail_bytes: int = 65536) -> tuple[dict | None, dict | None]:
    """The last train record and the last validation record in the tail of ``metrics``."""
    try:
        with open(metrics, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None, None
    train = valid = None
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if train is None and rec.get("kind") == "train":
            train = rec
        if valid is None and rec.get("kind") == "valid":
            valid = rec
        if train and valid:
            break
    return train, valid


def progress_lines(root: Path, plan: dict) -> list[str]:
    """One line per run: state, steps done, last tokens/s/GPU, last validation loss, launches."""
    total = plan["train_iters"]
    out = []
    for run in sorted(plan["runs"], key=lambda r: (r["gpu"], r["order"])):
        st = run_status(root, run["name"])
        train, valid = last_records(Path(run["output_dir"]) / "metrics.jsonl")
        step = train["step"] if train else 0
        tps = f"{train['tokens_per_s_per_gpu']:,.0f} tok/s/GPU" if train else "-"
        val = f"val {valid['val_loss']:.4f} @ step {valid['step']}" if valid else "no validation yet"
        code = f", exit {st['exit_code']}" if "exit_code" in st else ""
        out.append(
            f"  GPU {run['gpu']} {run['name']:<34} {st['state']:<9}{code} step {step:>6,}/{total:,} "
            f"{tps}; {val}; launches {st.get('launches', 0)}"
        )
    return out


def all_final(root: Path, plan: dict) -> bool:
    return all(run_status(root, r["name"])["state"] in FINAL for r in plan["runs"])


def pack(root: Path, out: Path) -> Path:
    """``out/trajectory.tgz``: plan, status, lane and set-up logs, each run's metrics.jsonl,
    run_meta.json and train.log, the comparison (no checkpoints, no TensorBoard files). Drops the
    console logs when the archive would exceed what the device returns."""
    out.mkdir(parents=True, exist_ok=True)
    dest = out / PACK_NAME

    def members(with_logs: bool) -> list[Path]:
        files = [root / "plan.json", root / "session.json", *sorted((root / "status").glob("*.json"))]
        files += sorted((root / "lanes").glob("*.log")) + sorted((root / "setup").glob("*.log"))
        for run_dir in sorted((root / "runs").glob("*")):
            for n in ("metrics.jsonl", "run_meta.json", *(("train.log",) if with_logs else ())):
                files.append(run_dir / n)
        files += sorted(p for p in (root / "compare").glob("*") if p.is_file())
        return [p for p in files if p.is_file()]

    for with_logs in (True, False):
        with tarfile.open(dest, "w:gz") as tar:
            for p in members(with_logs):
                tar.add(p, arcname=str(p.relative_to(root)))
        if dest.stat().st_size <= PACK_LIMIT:
            break
    return dest


def compare(root: Path, plan: dict, log: Path) -> tuple[int, str]:
    """tools/compare_runs.py over the runs with metrics into ``ROOT/compare``; ``(exit code, what)``.
    Runs cut short by the time budget are compared over the tokens that every run reached."""
    dirs, reached = [], []
    for run in plan["runs"]:
        d = Path(run["output_dir"])
        train, _ = last_records(d / "metrics.jsonl")
        if train is not None and (d / "run_meta.json").is_file():
            dirs.append(str(d))
            reached.append(train["consumed_tokens"])
    if len(dirs) < 2:
        return 1, f"{len(dirs)} run(s) with metrics: nothing to compare"
    cmd = [plan["python"], str(Path(plan["code_root"]) / "tools" / "compare_runs.py"), *dirs]
    cmd += ["--out", str(root / "compare")]
    cut = min(reached)
    if cut < plan["tokens_per_run"]:
        cmd += ["--max-tokens", str(cut)]
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        code = subprocess.run(cmd, cwd=plan["code_root"], stdout=f, stderr=subprocess.STDOUT).returncode
    what = f"{len(dirs)} runs"
    if cut < plan["tokens_per_run"]:
        what += f", cut at {cut:,} tokens (a run stopped early)"
    return code, what
