#!/usr/bin/env bash
# Multi-GPU validation of training and resume, every run through launch/torchrun_node.sh:
#
#   ref      1 process   (DP=1, gradient accumulation = global / micro batch)
#   dp       N processes (DP=N, same global batch)
#   preempt  N processes, own run dir: SIGTERM to torchrun_node.sh once metrics.jsonl shows a step
#            >= --preempt-at (expect exit 3), then the same command again (expect exit 0, a resume)
#   reshard  dp's step --reshard-step checkpoint copied into a new run dir, resumed with 1 process
#   seed     1 process, training.seed=4321: how far another random init moves the per-step losses
#            (megatron-core draws each TP shard from its own RNG stream on GPUs, so TP=2 starts from
#            another init than TP=1): the yardstick of the tp check; skipped on CPU, like tp
#   tp       N (even) processes with parallel.tensor=2 (DP=N/2); skipped on CPU (the CPU engine is
#            data-parallel only, training/engine_cpu.py)
#
# then tools/multi_gpu_report.py writes OUT/multi_gpu_report.md and .json (parity checks with stated
# tolerances, preemption/resume checks, reshard outcome, tokens/s/GPU scaling) and prints the markdown.
#
#   bash bench/multi_gpu.sh [N] [OUT_DIR] [CONFIG.yaml] [section.key=value ...] [options]
#   bash bench/multi_gpu.sh /tmp/mg                       # all visible GPUs, the defaults below
#
# Positional arguments are told apart by their form (a number, a .yaml file, section.key=value, else
# the output dir); options: [--nproc N] [--out DIR] [--config FILE] [--ckpt-root DIR] [--preempt-at S]
# [--reshard-step S] [--runs LIST] [--run-timeout S] [--budget S] [--overlap] [--force]
#
#   --nproc N        processes of the multi-process runs (default: GPUs visible; must be >= 2; on a
#                    machine without GPUs give it: the runs then use gloo on the CPU)
#   --out DIR        run dirs, logs, runs.tsv, bench.env, device.json, the report (default
#                    runs/multi_gpu); must be empty or absent unless --force (which deletes only
#                    the entries this script writes)
#   --config FILE    base config (default configs/small_gpu.yaml); section.key=value overrides on the
#                    command line are applied after DEFAULT_OVERRIDES (in this script: fp8 recipe,
#                    triton backend, 40 steps of 16 x 1024 tokens, micro-batch 4, deterministic, saves
#                    every 20 steps, validation 1 batch every 20, no telemetry), so yours win
#   --ckpt-root DIR  checkpoints go to DIR/<run> (checkpoint.dir) instead of OUT/<run>/checkpoints,
#                    e.g. a scratch disk, so that OUT stays small (reports, logs, metrics)
#   --preempt-at S   SIGTERM once step >= S is logged (default 25)
#   --reshard-step S the dp checkpoint resumed at DP=1 (default 20: must be a save step)
#   --runs LIST      which runs, in this order (default "ref dp preempt reshard seed tp")
#   --run-timeout S  per launch: SIGTERM after S s, SIGKILL of the whole tree 40 s later (default 240)
#   --budget S       whole script: no launch starts (and each is cut) past S s, so the report is
#                    always written (default 540, for a 10-minute command limit)
#   --overlap        all runs at once (reshard after dp has finished): for the CPU wiring test on a
#                    small machine (the report then gives no scaling figure); never for GPU measurements
#
# SIGTERM/SIGINT to this script (e.g. from timeout(1)): every running launch gets one SIGTERM (it saves
# and exits 3; launches run in their own session, so a signal to this script's process group does not
# reach them twice), the launches not started are recorded as skipped, the report is still written.
# Under `timeout T`, --budget a little below T (e.g. T - 20) cuts the runs before that happens.
#
# Environment: PYTHON (default .venv/bin/python if present, else python3), exported to the launcher.
# NCCL / multicast variables are not touched here (launch/env.sh only defaults NCCL_NVLS_ENABLE to 0);
# device.json records their values as the workers see them. Exit status: 0 when every check of the
# report passes, 1 otherwise (also when a run failed), 2 on a usage error.
set -uo pipefail  # no -e: a failed run is recorded and the script goes on

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
script_cmd="bash bench/multi_gpu.sh$(printf ' %q' "$@")"

DEFAULT_OVERRIDES=(
    attention.recipe=fp8 attention.backend=triton
    training.train_iters=40 training.warmup_iters=4 data.seq_length=1024
    training.micro_batch_size=4 training.global_batch_size=16
    runtime.deterministic=true checkpoint.save_interval=20 checkpoint.keep_last=3
    training.use_cpu_initialization=true
    validation.interval=20 validation.iters=1
    logging.telemetry_interval=0 logging.tensorboard=false logging.progress_bar=false logging.log_interval=5
)

SEED_YARDSTICK=4321  # training.seed of the seed run (the configs use the default 1234)

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "multi_gpu.sh: $*" >&2; exit 2; }

nproc="" out="runs/multi_gpu" config="configs/small_gpu.yaml" ckpt_root="" preempt_at=25 reshard_step=20
runs="ref dp preempt reshard seed tp" run_timeout=240 budget=540 force=0 overlap=0
user_overrides=() positional_n="" positional_out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --nproc) nproc="${2:?}"; shift 2 ;;
        --out) out="${2:?}"; shift 2 ;;
        --config) config="${2:?}"; shift 2 ;;
        --ckpt-root) ckpt_root="${2:?}"; shift 2 ;;
        --preempt-at) preempt_at="${2:?}"; shift 2 ;;
        --reshard-step) reshard_step="${2:?}"; shift 2 ;;
        --runs) runs="${2:?}"; shift 2 ;;
        --run-timeout) run_timeout="${2:?}"; shift 2 ;;
        --budget) budget="${2:?}"; shift 2 ;;
        --force) force=1; shift ;;
        --overlap) overlap=1; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *)  # positional: N, OUT_DIR, CONFIG.yaml, section.key=value
            if [[ "$1" =~ ^[A-Za-z_]+\.[A-Za-z0-9_]+= ]]; then user_overrides+=("$1")
            elif [[ "$1" =~ ^[0-9]+$ ]] && [ -z "$positional_n" ]; then nproc="$1" positional_n=1
            elif [[ "$1" == *.yaml || "$1" == *.yml ]]; then config="$1"
            elif [ -z "$positional_out" ]; then out="$1" positional_out=1
            else die "unexpected argument $1: overrides look like section.key=value (see --help)"
            fi
            shift ;;
    esac
done
for v in preempt_at reshard_step run_timeout budget; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || die "--${v//_/-} must be a whole number, got '${!v}'"
done

cd "$repo" || exit 2
[ -f "$config" ] || die "config $config not found (relative paths are relative to $repo)"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHON
case "$out" in /*) ;; *) out="$repo/$out" ;; esac
if [ -n "$ckpt_root" ]; then case "$ckpt_root" in /*) ;; *) ckpt_root="$repo/$ckpt_root" ;; esac; fi

# Everything this script writes under OUT (and CKPT_ROOT): --force removes exactly these.
owned=(ref dp tp seed preempt reshard .stop runs.tsv bench.env device.json multi_gpu_report.md multi_gpu_report.json)
if [ -d "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
    [ "$force" = 1 ] || die "$out is not empty: runs there would resume from old checkpoints; use a new --out or --force"
    for name in "${owned[@]}"; do rm -rf "${out:?}/$name"; done
    rm -f "$out"/*.log "$out"/*.exit
fi
if [ -n "$ckpt_root" ]; then
    for name in ref dp tp seed preempt reshard; do
        [ -e "$ckpt_root/$name" ] || continue
        [ "$force" = 1 ] || die "$ckpt_root/$name exists: a run would resume from its checkpoints; use another --ckpt-root or --force"
        rm -rf "${ckpt_root:?}/$name"
    done
fi
mkdir -p "$out" || die "cannot create $out"
t_start=$SECONDS
stop_flag="$out/.stop"
rm -f "$stop_flag"
launcher=()
if command -v setsid >/dev/null 2>&1; then launcher=(setsid); fi

# ----------------------------------------------------------------------------- device probe
# One interpreter start: GPU count and name, versions, and the multicast/NCCL variables as the workers
# will see them (after launch/env.sh, which the launcher sources).
probe_env="$(
    # shellcheck source=launch/env.sh
    source "$repo/launch/env.sh"
    for v in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS CUDA_VISIBLE_DEVICES \
             PYTHONPATH OMP_NUM_THREADS; do
        printf '%s=%s\n' "$v" "${!v-<unset>}"
    done
)"
# No NVIDIA device node and no nvidia-smi: skip importing torch (2 s of a CPU-only test run).
maybe_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 || compgen -G '/dev/nvidia[0-9]*' >/dev/null; then maybe_gpu=1; fi
gpus="$(PROBE_ENV="$probe_env" MAYBE_GPU="$maybe_gpu" "$PYTHON" - "$out/device.json" <<'EOF'
import datetime, importlib.metadata, importlib.util, json, os, platform, sys
info = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "python": sys.executable, "python_version": platform.python_version(),
        "launch_env": dict(line.split("=", 1) for line in os.environ["PROBE_ENV"].splitlines() if "=" in line),
        "gpu_count": 0, "gpu_names": [], "device": "cpu"}
try:
    if os.environ["MAYBE_GPU"] == "1":
        import torch
        n = torch.cuda.device_count()
        info.update(torch=torch.__version__, gpu_count=n, device="cuda" if n else "cpu",
                    gpu_names=[torch.cuda.get_device_name(i) for i in range(n)])
    else:
        info["torch"] = importlib.metadata.version("torch")
except Exception as exc:  # recorded; the runs will fail and say why
    info.update(probe_error=f"{type(exc).__name__}: {exc}", device="unknown")
info["megatron_core_found"] = importlib.util.find_spec("megatron") is not None
with open(sys.argv[1], "w") as f:
    json.dump(info, f, indent=1)
print(info["gpu_count"])
EOF
)"
gpus="${gpus:-0}"
[[ "$gpus" =~ ^[0-9]+$ ]] || gpus=0
if [ -z "$nproc" ]; then
    [ "$gpus" -ge 1 ] || die "no GPU visible to $PYTHON (see $out/device.json); give --nproc 2 to check the wiring on the CPU (gloo)"
    nproc="$gpus"
fi
[[ "$nproc" =~ ^[0-9]+$ ]] && [ "$nproc" -ge 2 ] || die "--nproc must be >= 2, got $nproc"
if [ "$gpus" -ge 1 ] && [ "$nproc" -gt "$gpus" ]; then
    die "--nproc $nproc but only $gpus GPU(s) visible"
fi
if [ "$gpus" -ge 1 ]; then device=cuda; else device=cpu; fi
echo "multi_gpu.sh: $device, N=$nproc, out $out, python $PYTHON" >&2

overrides=("${DEFAULT_OVERRIDES[@]}" "${user_overrides[@]}")
{
    printf 'script_cmd=%s\n' "$script_cmd"
    printf 'device=%s\nnproc=%s\nconfig=%s\npreempt_at=%s\nreshard_step=%s\nruns=%s\nckpt_root=%s\noverlap=%s\n' \
        "$device" "$nproc" "$config" "$preempt_at" "$reshard_step" "$runs" "$ckpt_root" "$overlap"
    printf 'overrides=%s\n' "${overrides[*]}"
    printf 'bench_commit=%s\n' "${BENCH_COMMIT:-}"
    if git -C "$repo" rev-parse --short HEAD >/dev/null 2>&1; then
        printf 'git_commit=%s\n' "$(git -C "$repo" rev-parse --short HEAD)"
        printf 'git_modified_files=%s\n' "$(git -C "$repo" status --porcelain --untracked-files=no | wc -l | tr -d ' ')"
    fi
} > "$out/bench.env"
printf 'label\trun_dir\tnproc\trc\twall_s\tstatus\tcommand\n' > "$out/runs.tsv"

# ----------------------------------------------------------------------------- helpers
last_train_step() {  # newest step of a train record in metrics.jsonl (0 if none)
    local s
    s="$(grep '"kind": "train"' "$1" 2>/dev/null | grep -o '"step": [0-9]*' | tail -n 1 | grep -o '[0-9]*$')"
    [[ "$s" =~ ^[0-9]+$ ]] || s=0
    echo "$s"
}

descendants() {  # every descendant pid of $1 (torchrun's workers run in their own sessions)
    local kids k
    if command -v pgrep >/dev/null 2>&1; then
        kids="$(pgrep -P "$1" 2>/dev/null || true)"
    else
        kids="$(awk -v p="$1" '/^PPid:/ && $2 == p {split(FILENAME, a, "/"); print a[3]}' /proc/[0-9]*/status 2>/dev/null)"
    fi
    for k in $kids; do
        echo "$k"
        descendants "$k"
    done
}

record() {  # label run_dir nproc rc wall status command
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$out/runs.tsv"
}

ckpt_dir_of() {  # run name -> its checkpoint dir
    if [ -n "$ckpt_root" ]; then echo "$ckpt_root/$1"; else echo "$out/$1/checkpoints"; fi
}

# launch LABEL RUN NPROC PREEMPT_AT [VAR=value ...] -- [override ...]
# Runs launch/torchrun_node.sh in the background (its stdout+stderr to OUT/LABEL.log), sends it SIGTERM
# once a train step >= PREEMPT_AT is logged (0 = never), enforces the time limits, records the row.
launch() {
    local label="$1" run="$2" np="$3" preempt="$4"
    shift 4
    local -a envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    local run_dir="$out/$run" log="$out/$label.log"
    local -a args=(--config "$config" "${overrides[@]}" "$@" "runtime.output_dir=$run_dir")
    [ -n "$ckpt_root" ] && args+=("checkpoint.dir=$(ckpt_dir_of "$run")")
    local port  # unused by --standalone (one node), distinct anyway
    case "$label" in ref) port=29611 ;; dp) port=29612 ;; preempt.1) port=29613 ;; preempt.2) port=29614 ;;
                     reshard) port=29615 ;; seed) port=29616 ;; *) port=29617 ;; esac
    local -a cmd=(env "NPROC_PER_NODE=$np" "PRETRAIN_EXIT_FILE=$out/$label.exit" "MASTER_PORT=$port"
                  "PYTHON=$PYTHON" "${envs[@]}" bash launch/torchrun_node.sh "${args[@]}")
    local cmd_text
    cmd_text="$(printf '%q ' "${cmd[@]}")"
    local left=$((budget - (SECONDS - t_start) - 45))  # room for the 40 s grace below and the report
    local limit=$run_timeout
    [ "$left" -lt "$limit" ] && limit=$left
    if [ -e "$stop_flag" ]; then
        record "$label" "$run_dir" "$np" "" "" "skipped: multi_gpu.sh was asked to stop (SIGTERM/SIGINT)" "$cmd_text"
        return 0
    fi
    if [ "$left" -lt 30 ]; then
        echo "multi_gpu.sh: $label skipped: the --budget of ${budget} s is spent" >&2
        record "$label" "$run_dir" "$np" "" "" "skipped: --budget ${budget} s spent" "$cmd_text"
        return 0
    fi
    echo "multi_gpu.sh: $label: $np process(es), log $log (limit ${limit} s)" >&2
    local t0=$SECONDS status="exited" sent=0 stopped=0 step
    # Own session (setsid): a signal to this script's process group (timeout(1) sends one) must not
    # reach torchrun_node.sh and torchrun directly as well; the stop flag forwards exactly one SIGTERM.
    "${launcher[@]}" "${cmd[@]}" > "$log" 2>&1 &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        if [ -e "$stop_flag" ] && [ "$stopped" = 0 ]; then
            kill -TERM "$pid" 2>/dev/null
            stopped=1
            status="stopped: multi_gpu.sh got SIGTERM/SIGINT and passed SIGTERM on (save and exit)"
            echo "multi_gpu.sh: $label: stopping (SIGTERM to torchrun_node.sh, pid $pid)" >&2
        fi
        if [ "$preempt" -gt 0 ] && [ "$sent" = 0 ] && [ "$stopped" = 0 ]; then
            step="$(last_train_step "$run_dir/metrics.jsonl")"
            if [ "$step" -ge "$preempt" ]; then
                kill -TERM "$pid" 2>/dev/null
                sent=1
                status="exited; SIGTERM sent after step $step was logged"
                echo "multi_gpu.sh: $label: step $step logged, SIGTERM sent to torchrun_node.sh (pid $pid)" >&2
            fi
        fi
        if [ $((SECONDS - t0)) -ge "$limit" ]; then
            status="timeout after ${limit} s: SIGTERM sent (save and exit)"
            echo "multi_gpu.sh: $label: time limit ${limit} s reached, SIGTERM (save and exit)" >&2
            kill -TERM "$pid" 2>/dev/null
            local waited=0  # torchrun itself SIGKILLs its workers 30 s after passing SIGTERM on
            while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 400 ]; do sleep 0.1; waited=$((waited + 1)); done
            if kill -0 "$pid" 2>/dev/null; then
                echo "multi_gpu.sh: $label: still running 40 s later, SIGKILL to the process tree" >&2
                status="$status, SIGKILL of the process tree 40 s later"
                local victims
                victims="$(descendants "$pid")"
                # shellcheck disable=SC2086  # one pid per word
                kill -KILL "$pid" $victims 2>/dev/null
            fi
            break
        fi
        sleep 0.1
    done
    local rc
    wait "$pid"
    rc=$?
    while kill -0 "$pid" 2>/dev/null; do  # a trapped signal interrupts wait: wait again
        wait "$pid"
        rc=$?
    done
    local wall=$((SECONDS - t0))
    echo "multi_gpu.sh: $label: exit code $rc after ${wall} s" >&2
    record "$label" "$run_dir" "$np" "$rc" "$wall" "$status" "$cmd_text"
}

# ----------------------------------------------------------------------------- the runs
tp_np=$((nproc - nproc % 2))

# ref, seed and tp need no checkpoint but the final one (checkpoint.* never changes the numerics); dp
# keeps the --reshard-step one for reshard, preempt the one it resumes from.
stage() {  # one entry of --runs (preempt = its two launches, reshard = copy + launch)
    case "$1" in
        ref) launch ref ref 1 0 -- checkpoint.save_interval=0 ;;
        dp) launch dp dp "$nproc" 0 -- ;;
        preempt)
            launch preempt.1 preempt "$nproc" "$preempt_at" --
            launch preempt.2 preempt "$nproc" 0 -- ;;
        reshard)
            local src dst
            src="$(ckpt_dir_of dp)/$(printf 'iter_%07d' "$reshard_step")"
            dst="$(ckpt_dir_of reshard)"
            if [ -e "$stop_flag" ]; then
                record reshard "$out/reshard" 1 "" "" "skipped: multi_gpu.sh was asked to stop (SIGTERM/SIGINT)" ""
                return 0
            fi
            if [ ! -f "$src/manifest.json" ]; then
                echo "multi_gpu.sh: reshard skipped: $src is not a complete checkpoint" >&2
                record reshard "$out/reshard" 1 "" "" "skipped: $src is not a complete checkpoint (dp failed, or pruned: checkpoint.keep_last)" ""
                return 0
            fi
            mkdir -p "$dst" && cp -r "$src" "$dst/" && printf '%s\n' "$reshard_step" > "$dst/latest_checkpointed_iteration.txt"
            launch reshard reshard 1 0 -- ;;
        seed)
            if [ "$device" = cpu ]; then
                record seed "$out/seed" 1 "" "" "skipped: only the yardstick of the tp check, which is skipped on CPU" ""
            else
                launch seed seed 1 0 -- "training.seed=$SEED_YARDSTICK" checkpoint.save_interval=0
            fi ;;
        tp)
            if [ "$device" = cpu ]; then
                record tp "$out/tp" "$tp_np" "" "" "skipped: the CPU engine supports data parallelism only (training/engine_cpu.py); TP runs on GPUs" ""
            else
                launch tp tp "$tp_np" 0 TP=2 -- parallel.tensor=2 checkpoint.save_interval=0
            fi ;;
        *) echo "multi_gpu.sh: unknown run '$1' in --runs (ref dp preempt reshard seed tp)" >&2 ;;
    esac
}

wait_for() {  # wait until process $1 has exited (a trapped signal interrupts wait)
    wait "$1" 2>/dev/null
    while kill -0 "$1" 2>/dev/null; do wait "$1" 2>/dev/null; done
}

# SIGTERM/SIGINT (e.g. timeout(1)): each running launch gets one SIGTERM (saves, exits 3), the runs not
# started are recorded as skipped, and the report is still written.
trap 'touch "$stop_flag"; echo "multi_gpu.sh: SIGTERM/SIGINT: stopping the runs, then the report" >&2' TERM INT
background=() dp_job=""
for run in $runs; do
    if [ "$overlap" = 0 ]; then
        stage "$run"
        continue
    fi
    # --overlap: every stage in the background at once, except that reshard waits for dp's checkpoint
    if [ "$run" = reshard ] && [ -n "$dp_job" ]; then wait_for "$dp_job"; fi
    (
        trap 'touch "$stop_flag"' TERM INT
        stage "$run"
    ) &
    background+=("$!")
    [ "$run" = dp ] && dp_job=$!
done
for job in "${background[@]}"; do wait_for "$job"; done
trap - TERM INT
echo "multi_gpu.sh: runs done after $((SECONDS - t_start)) s; report:" >&2
"$PYTHON" "$repo/tools/multi_gpu_report.py" "$out"
code=$?
if [ -e "$stop_flag" ]; then
    rm -f "$stop_flag"
    exit 1
fi
exit "$code"
