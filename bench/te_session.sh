#!/usr/bin/env bash
# Transformer Engine projections on the GPU machine, with the CuTe bundle beside them (the default
# arms of bench/train_throughput.py need both: TE projections, FA4 BF16 and CuTe fp8 attention).
# Ten back-to-back device calls, each within 30 s of the last (the machine stays up 30 s after a
# call); every bundle stays git-ignored in the checkout (../shared/offline-gpu/README.md builds them;
# then `bash bench/te_bundle_parts.sh` re-cuts TE's core wheel into 48 MiB parts: a 60 MiB part and
# the ~6 MB checkout exceed the 64 MiB a call carries). Run 2026-12-03: results/te_h200/README.md.
#
#   1  carry .gpu-bundle/wheels .gpu-bundle/cute-a.tar.xz .gpu-bundle/install.sh
#        SKIP_TRITON_TESTS=1 bash bench/cute_session.sh A
#   2  carry .gpu-bundle/cute-b.tar.xz .whl
#        STEPS=" " bash bench/cute_session.sh B            (CuTe part B and the megatron-core wheels)
#   3-8  carry .te-bundle/te-core.part-0N .te-bundle/te-core.name .te-bundle/te-core.count
#        .te-bundle/te_install.sh (N = 0..5; with part 05 also .te-bundle/te-wheels)
#        bash bench/te_session.sh install
#   9  carry .te-bundle/te_install.sh
#        BENCH_COMMIT=<sha> STEPS=tests bash bench/te_session.sh run      (up to 540 s)
#        then, when parity is wanted, one more call with STEPS=parity PARITY_TIMEOUT=100 (each parity
#        run about 70 s)
#   10 carry .te-bundle/te_install.sh
#        BENCH_COMMIT=<sha> STEPS=throughput THROUGHPUT_BUDGET=520 bash bench/te_session.sh run
#        (the micro-batch 4 runs and the 32-layer extrapolation fit 520 s; micro-batch 2 and 1 need
#        a second call of bench/train_throughput.py --micro-batches 2 1 --extrapolate-from-layers 0)
#
# run STEPS, each with its own time limit:
# The "tests" step alone needs no CuTe calls: carry megatron-core's wheel (and llama-models') from
# .whl with the last TE part (all of .whl, 32 MB, does not fit beside it), e.g. to re-run the TE tests
# after a fix: 6 install calls, then STEPS=tests.
#   "tests": pytest -m gpu tests/llama tests/training: TE FP8 builds and trains with current and
#     delayed scaling, resumes bitwise in deterministic mode with either (the FP8 scaling state in
#     the checkpoint), SIGTERM mid-run saves and the relaunch finishes; the megatron-core engine's
#     resume, async save and damaged-checkpoint fall-back, all through the torch_dist vetting
#     (training/torch_dist_vetting.py) (TE_TESTS_TIMEOUT, 540 s; the TE tests alone took 181 s);
#   "parity": configs/small_gpu.yaml, recipe bf16 on fa4, PARITY_ITERS (120) steps: local projections
#     seed 1234, TE BF16 projections seed 1234, local seed 1235 (the seed yardstick of the same run);
#     the final validation losses (PARITY_TIMEOUT per run, 150 s);
#   "throughput": bench/train_throughput.py with its default arms (TE BF16 + FA4 BF16 as the bf16
#     baseline), --budget-s THROUGHPUT_BUDGET (560 s).
# Logs and results are written under /tmp/te-logs (LOGS) and packed into $OUT/te_session_<mode>.tgz on
# exit, with a copy of status.txt (the device tool brings back at most 8 files). $OUT defaults to te-logs.
set -uo pipefail
mode=${1:?usage: bash bench/te_session.sh install|run}
[[ $mode == install || $mode == run ]] || { echo "te_session: mode must be install or run, got '$mode'" >&2; exit 2; }
dest="${OUT:-te-logs}"; out="${LOGS:-/tmp/te-logs}"; mkdir -p "$dest" "$out"
pack() { tar czf "$dest/te_session_$mode.tgz" -C "$out" . && { [[ -f $out/status.txt ]] && cp "$out/status.txt" "$dest/"; }; }
trap pack EXIT
export PYTHONPATH="/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"
# megatron-core & co: cute_session.sh B installs them; without the CuTe calls, carry .whl once
if ! python3 -c "import megatron.core" 2> /dev/null && compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
need_cute() {  # parity (FA4 attention) and throughput (FA4 and cute arms) need the CUTLASS DSL
  [[ -d /tmp/site/nvidia_cutlass_dsl ]] || {
    echo "te_session: step $1 needs the CUTLASS DSL in /tmp/site: run bench/cute_session.sh A and B on this machine first" >&2
    exit 2
  }
}
# shellcheck disable=SC1091
source .te-bundle/te_install.sh .te-bundle /tmp/te || { echo "te_session: te_install.sh failed" >&2; exit 2; }
if [[ $mode == install ]]; then
  [[ -f /tmp/te/.te.done ]] && python3 -c "import transformer_engine as t, transformer_engine.pytorch; print('TE', t.__version__)"
  exit 0
fi
[[ -f /tmp/te/.te.done ]] || { echo "te_session: Transformer Engine is not installed yet: send its parts first (install)" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
steps=" ${STEPS:-tests parity} "
if [[ $steps == *" tests "* ]]; then
  timeout "${TE_TESTS_TIMEOUT:-540}" python3 -m pytest -q -m gpu tests/llama tests/training \
    -p no:cacheprovider -rs > "$out/te_tests.log" 2>&1; echo "te tests rc=$?" | tee -a "$out/status.txt"
  tail -8 "$out/te_tests.log"
fi
if [[ $steps == *" parity "* ]]; then
  need_cute parity
  iters=${PARITY_ITERS:-120}
  for run in local:1234 transformer_engine:1234 local:1235; do
    impl=${run%%:*}; seed=${run##*:}
    timeout "${PARITY_TIMEOUT:-150}" python3 pretrain_llama.py --config configs/small_gpu.yaml attention.recipe=bf16 \
      attention.backend=fa4 model.transformer_impl="$impl" projection.precision=bf16 training.seed="$seed" \
      training.train_iters="$iters" checkpoint.save_interval=1000000 validation.interval=$((iters / 2)) \
      runtime.output_dir="/tmp/parity_${impl}_$seed" > "$out/parity_${impl}_seed$seed.log" 2>&1
    echo "parity $impl seed $seed rc=$?" | tee -a "$out/status.txt"
    grep "validation loss" "$out/parity_${impl}_seed$seed.log" | tail -1
  done
fi
if [[ $steps == *" throughput "* ]]; then
  need_cute throughput
  budget=${THROUGHPUT_BUDGET:-560}
  timeout $((budget + 30)) python3 bench/train_throughput.py --budget-s "$budget" --run-dir /tmp/train_throughput_runs \
    --out "$out/train_throughput_te_h200" > "$out/throughput.log" 2>&1; echo "throughput rc=$?" | tee -a "$out/status.txt"
  tail -30 "$out/throughput.log"
fi
