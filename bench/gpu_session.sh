#!/usr/bin/env bash
# One device-tool call on an H200 machine: install the carried wheels, prepare the data, then run
# the named jobs lane by lane: a lane is a sequence of jobs on one GPU (lane i on GPU i), the lanes
# run at the same time; the ALL_GPU jobs use every GPU and run first. Logs and results are packed
# into $OUT/session.tgz; a one-line status per job goes to $OUT/status.txt and stdout.
#
#   bash bench/gpu_session.sh BUDGET_S "ALL_GPU_JOBS" "LANE0_JOBS" ["LANE1_JOBS" ...]
#
# Jobs (each with its own time limit, cut to what is left of BUDGET_S):
#   multigpu       bench/multi_gpu.sh over all GPUs
#   multigpu2      the same on GPUs 0 and 1 (ref dp preempt reshard tp), beside other lanes
#   multigpu_tp    GPUs 0 and 1: ref, TP=2 and the other-seed yardstick only
#   tests_gpu      pytest -m gpu on fp4_attention's tests (tests/backends, tests/numerics, tests/test_*.py)
#   tests_model    pytest -m gpu tests/llama
#   tests_training pytest -m gpu tests/training     tune          bench/tune_fwd.py
#   bench          bench/attention_bench.py          main          the default job (pretrain_llama.py)
#   traj_A / traj_B  bench/trajectory_runs.sh, seed 1234 / 1235, all three arms
#   throughput     bench/train_throughput.py, the local-projection arms on the Triton backend (this
#                  session installs neither Transformer Engine nor the CuTe bundle, which its default
#                  arms need: run those with bench/te_session.sh, which installs both)
#   fidelity       tools/fidelity.py with the Triton backend (Direct-P enabled)
set -uo pipefail
budget="${1:?budget seconds}"; both="${2:-}"
shift 2 || true
start=$(date +%s)
out="${OUT:-gpu-logs}"
work=/tmp/session
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 PYTHON=python3 PYDOCS_PREPARED="$PWD/.gpudata"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
export BENCH_COMMIT="${BENCH_COMMIT:-$commit}"
nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,temperature.gpu --format=csv > "$work/nvidia_smi.csv" 2>&1
python3 -m data.prepare --default --no-progress > "$work/data_prepare.log" 2>&1
mkdir -p cache/data/python_docs && cp .gpudata/pydocs.* cache/data/python_docs/

left() { echo $(( budget - ($(date +%s) - start) )); }
limit() { local want="$1" l; l=$(( $(left) - 25 )); [ "$l" -lt "$want" ] && want="$l"; echo "$want"; }

job() {  # job NAME GPU: run one job with its time limit; print and record its exit code
    local name="$1" gpu="$2" t0 code lim
    t0=$(date +%s)
    case "$name" in
        multigpu) lim=$(limit 300); timeout "$lim" bash bench/multi_gpu.sh "$work/multigpu" --ckpt-root /tmp/mg_ckpt --budget $((lim - 20)) ;;
        multigpu2) lim=$(limit 340); CUDA_VISIBLE_DEVICES=0,1 timeout "$lim" bash bench/multi_gpu.sh 2 "$work/multigpu2" --runs "ref dp preempt reshard tp" --ckpt-root /tmp/mg_ckpt2 --budget $((lim - 20)) ;;
        multigpu_tp) lim=$(limit 300); CUDA_VISIBLE_DEVICES=0,1 timeout "$lim" bash bench/multi_gpu.sh 2 "$work/multigpu_tp" --runs "ref tp seed" --ckpt-root /tmp/mg_ckpt3 --budget $((lim - 20)) ;;
        tests_gpu) lim=$(limit 300); CUDA_VISIBLE_DEVICES="$gpu" timeout "$lim" python3 -m pytest -q -m gpu tests/backends tests/numerics tests/test_interface.py -p no:cacheprovider -s ;;
        tests_model) lim=$(limit 200); CUDA_VISIBLE_DEVICES="$gpu" timeout "$lim" python3 -m pytest -q -m gpu tests/llama -p no:cacheprovider ;;
        tests_training) lim=$(limit 300); CUDA_VISIBLE_DEVICES="$gpu" timeout "$lim" python3 -m pytest -q -m gpu tests/training -p no:cacheprovider ;;
        tune) lim=$(limit 260); CUDA_VISIBLE_DEVICES="$gpu" timeout "$lim" python3 bench/tune_fwd.py --out "$work/tune_fwd_h200" ;;
        bench) lim=$(limit 240); CUDA_VISIBLE_DEVICES="$gpu" timeout "$lim" python3 bench/attention_bench.py --out "$work/attention_bench_h200" ;;
        main) lim=$(limit 200); CUDA_VISIBLE_DEVICES="$gpu" timeout "$lim" python3 pretrain_llama.py runtime.output_dir="$work/main_job" ;;
        traj_A) lim=$(limit 330); COMPARE=0 timeout "$lim" bash bench/trajectory_runs.sh "$work/trajectory" "bf16 fp8 nvfp4qk_fp8pv" 1234 "$gpu" ;;
        traj_B) lim=$(limit 330); COMPARE=0 timeout "$lim" bash bench/trajectory_runs.sh "$work/trajectory" "bf16 fp8 nvfp4qk_fp8pv" 1235 "$gpu" ;;
        throughput) lim=$(limit 480); CUDA_VISIBLE_DEVICES="$gpu" timeout "$lim" python3 bench/train_throughput.py --budget-s $((lim - 20)) --arms local-bf16 local-bf16+fp8-attn local-bf16+nvfp4qk_fp8pv --backend-override bf16=triton fp8=triton nvfp4qk_fp8pv=triton --run-dir "$work/train_throughput_runs" --out "$work/train_throughput_h200" ;;
        fidelity) lim=$(limit 200); CUDA_VISIBLE_DEVICES="$gpu" timeout "$lim" python3 tools/fidelity.py --backend triton --device cuda --out "$work/fidelity_triton" ;;
        *) echo "unknown job $name"; false ;;
    esac > "$work/$name.log" 2>&1
    code=$?
    echo "job $name (gpu $gpu): exit $code, $(( $(date +%s) - t0 )) s; $(tail -n 1 "$work/$name.log" | cut -c1-160)" \
        | tee -a "$out/status.txt"
}

lane() {  # lane GPU JOBS...  (each GPU lane has its own data cache: megatron's index files are
    local gpu="$1"; shift       # written by whichever process first needs them)
    [ "$gpu" = all ] || export PRETRAIN_DATA_CACHE="/tmp/data_cache_gpu$gpu"
    for j in "$@"; do
        [ "$(left)" -gt 40 ] || { echo "job $j (gpu $gpu): skipped, out of time" | tee -a "$out/status.txt"; continue; }
        job "$j" "$gpu"
    done
}

# shellcheck disable=SC2086  # job lists are word lists
lane all $both
pids=(); gpu=0
for jobs in "$@"; do
    # shellcheck disable=SC2086
    lane "$gpu" $jobs &
    pids+=($!); gpu=$((gpu + 1))
done
[ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
find "$work" -name '*.pt' -path '*checkpoints*' -delete 2>/dev/null
find "$work" -type d -name 'checkpoints' -prune -exec rm -rf {} + 2>/dev/null
tar czf "$out/session.tgz" -C "$work" . 2>/dev/null
echo "session: $(( $(date +%s) - start )) s; $(du -h "$out/session.tgz" | cut -f1) of logs"
cat "$out/status.txt"
