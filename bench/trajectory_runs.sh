#!/usr/bin/env bash
# Matched BF16-vs-low-precision training runs (configs/trajectory_small_s2048.yaml), then
# tools/compare_runs.py over all of them.
#
#   bash bench/trajectory_runs.sh OUT_ROOT [ARMS] [SEEDS] [GPUS] [-- OVERRIDES...]
#
#   OUT_ROOT  run directories <OUT_ROOT>/<arm>_seed<seed>/ and the comparison <OUT_ROOT>/compare/
#   ARMS      attention recipes, space-separated (default "bf16 fp8 nvfp4qk_fp8pv")
#   SEEDS     training.seed values, one run per arm and seed (default "1234 1235"); data.seed is the
#             config's in every run, so all runs read the same batches in the same order
#   GPUS      CUDA device ids (default "0"); the seeds are dealt round-robin over the GPUs and each
#             GPU runs its runs one after another (one GPU per run)
#   OVERRIDES passed to every run (e.g. training.train_iters=20 for a smoke test)
#   COMPARE=0 (environment) skips the comparison (when other seeds run in another invocation).
#
# Data, prepared here when missing (python -m data.prepare, deterministic):
#   * the default corpus (KJV + CPython stdlib) into cache/data/default;
#   * the CPython 3.11 documentation sources into cache/data/python_docs/pydocs, from
#     PYDOCS_PREPARED=DIR (a folder holding an already prepared pydocs.bin/.idx/.manifest.json) or
#     PYDOCS_SOURCES=DIR (the html/_sources folder of Debian's python3.11-doc package:
#       apt-get download python3.11-doc && dpkg -x python3.11-doc_*.deb root &&
#       PYDOCS_SOURCES=root/usr/share/doc/python3.11/html/_sources).
# Exit status: 0 when every run finished (exit 0) and the comparison was written; 1 otherwise.
#
# Runs of >= 200M tokens do not fit one device call: bench/trajectory_session.py sizes them to the
# device budget, runs them detached, one per GPU, across back-to-back calls (see its header).
set -uo pipefail
if [ $# -lt 1 ]; then
    sed -n '2,25p' "$0" >&2
    exit 2
fi
root="$1"; shift
arms="bf16 fp8 nvfp4qk_fp8pv"; seeds="1234 1235"; gpus="0"
for var in arms seeds gpus; do
    if [ $# -gt 0 ] && [ "$1" != "--" ]; then printf -v "$var" '%s' "$1"; shift; fi
done
[ "${1:-}" = "--" ] && shift
overrides=("$@")
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo" || exit 2
py="${PYTHON:-python3}"
config=configs/trajectory_small_s2048.yaml
mkdir -p "$root"

# the data (bench/trajectory/setup.py, shared with bench/trajectory_session.py)
"$py" bench/trajectory_session.py --prepare-data committed || exit $?

read -ra gpu_list <<<"$gpus"
read -ra seed_list <<<"$seeds"
read -ra arm_list <<<"$arms"
run_gpu() {  # run_gpu GPU SEED... : every arm for each seed, one after another on one GPU
    local gpu="$1"; shift
    local seed arm dir code
    for seed in "$@"; do
        for arm in "${arm_list[@]}"; do
            dir="$root/${arm}_seed${seed}"
            CUDA_VISIBLE_DEVICES="$gpu" "$py" pretrain_llama.py --config "$config" attention.recipe="$arm" \
                training.seed="$seed" runtime.output_dir="$dir" "${overrides[@]}" >"$root/${arm}_seed${seed}.log" 2>&1
            code=$?
            echo "$code" >"$root/${arm}_seed${seed}.code"
            echo "trajectory_runs.sh: gpu $gpu ${arm} seed ${seed}: exit ${code} ($(grep -c '"kind": "train"' \
                "$dir/metrics.jsonl" 2>/dev/null || echo 0) steps logged)"
        done
    done
}

pids=()
for i in "${!gpu_list[@]}"; do
    mine=()
    for j in "${!seed_list[@]}"; do
        [ $((j % ${#gpu_list[@]})) -eq "$i" ] && mine+=("${seed_list[$j]}")
    done
    [ ${#mine[@]} -gt 0 ] || continue
    run_gpu "${gpu_list[$i]}" "${mine[@]}" &
    pids+=($!)
    if [ "$i" -eq 0 ] && [ ${#gpu_list[@]} -gt 1 ]; then
        # Let the first run build megatron's shared index cache before the others read it.
        first="$root/${arm_list[0]}_seed${mine[0]}.log"
        for _ in $(seq 600); do
            grep -q "^data: " "$first" 2>/dev/null && break
            kill -0 "${pids[0]}" 2>/dev/null || break
            sleep 0.5
        done
    fi
done
wait "${pids[@]}"

ok=1; runs=()
for seed in "${seed_list[@]}"; do
    for arm in "${arm_list[@]}"; do
        [ "$(cat "$root/${arm}_seed${seed}.code" 2>/dev/null)" = 0 ] || ok=0
        [ -f "$root/${arm}_seed${seed}/metrics.jsonl" ] && runs+=("$root/${arm}_seed${seed}")
    done
done
if [ "${COMPARE:-1}" = 0 ]; then
    :
elif [ ${#runs[@]} -ge 2 ]; then
    "$py" tools/compare_runs.py "${runs[@]}" --out "$root/compare" || ok=0
else
    ok=0
fi
[ "$ok" = 1 ] && exit 0 || exit 1
