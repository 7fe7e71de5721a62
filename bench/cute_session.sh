#!/usr/bin/env bash
# Issue 11 on the GPU machine, in two back-to-back device calls (the CUTLASS DSL bundle travels in
# two parts, ../shared/offline-gpu/README.md):
#   call A, carry .gpu-bundle/wheels .gpu-bundle/cute-a.tar.xz .gpu-bundle/install.sh:
#       BENCH_COMMIT=<sha> bash bench/cute_session.sh A     (installs; runs the Triton GPU tests)
#   call B, machine still warm, carry .gpu-bundle/cute-b.tar.xz .gpu-bundle/install.sh .whl:
#       BENCH_COMMIT=<sha> bash bench/cute_session.sh B [TILES...]
#         STEPS (default "tests bench"): CuTe + FA4 GPU tests (TESTS_TIMEOUT, default 240 s);
#         "profile": Nsight Compute of bench/cute_profile.py, one warm launch per PROFILE_VARIANTS
#         (default "fp8 fa4_bf16") at PROFILE_SHAPE (B,Hq,Hkv,S; default 2,32,32,8192);
#         "bench": bench/attention_bench.py --cute (BENCH_RECIPES, default fp8), same-run baselines
# Logs and results go to $OUT (default cute-logs).
set -uo pipefail
mode=${1:?usage: bash bench/cute_session.sh A|B [tile_m,tile_n,stages ...]}; shift
out="${OUT:-cute-logs}"; mkdir -p "$out"
if [[ $mode == A ]]; then
  # shellcheck disable=SC1091
  source .gpu-bundle/install.sh .gpu-bundle /tmp/site
else
  # not install.sh again: it would reinstall the wheels with --upgrade, which replaces the
  # nvidia_cutlass_dsl folder and so deletes the cute-a part unpacked into it by call A
  xz -d -T0 -c .gpu-bundle/cute-b.tar.xz | tar x -C /tmp/site
  export PYTHONPATH="/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
if [[ $mode == A ]]; then
  [[ ${SKIP_TRITON_TESTS:-0} == 1 ]] && exit 0
  timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_triton_backend.py tests/gpu/test_triton_quant.py \
    -p no:cacheprovider > "$out/triton_tests.log" 2>&1; echo "triton tests rc=$?" | tee -a "$out/status.txt"
  tail -3 "$out/triton_tests.log"
  exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/nvidia_cudnn_frontend*.whl
tiles=("$@"); [[ ${#tiles[@]} -gt 0 ]] || tiles=("128,128,2")
steps=" ${STEPS:-tests bench} "
if [[ $steps == *" tests "* ]]; then
  timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -m gpu tests/gpu/test_cute_backend.py -p no:cacheprovider \
    > "$out/cute_tests.log" 2>&1; echo "cute tests rc=$?" | tee -a "$out/status.txt"
  tail -25 "$out/cute_tests.log"
fi
if [[ $steps == *" profile "* ]]; then  # Nsight Compute, one warm launch per variant (bench/cute_profile.py)
  ncu=$(command -v ncu || find /opt/nvidia -name ncu -type f | sort | tail -1)
  for variant in ${PROFILE_VARIANTS:-fp8 fa4_bf16}; do
    name=FP8ForwardSm90; [[ $variant == fa4_bf16 ]] && name=FlashAttentionForwardSm90
    rep="$out/prof_$variant"
    timeout 150 "$ncu" --clock-control none -k "regex:$name" --launch-skip 2 --launch-count 1 --set full \
      --import-source no -f -o "$rep" python3 bench/cute_profile.py --variant "$variant" \
      --shape "${PROFILE_SHAPE:-2,32,32,8192}" > "$rep.log" 2>&1; echo "profile $variant rc=$?" | tee -a "$out/status.txt"
    "$ncu" -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
    "$ncu" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
    "$ncu" -i "$rep.ncu-rep" --page raw --csv > "$rep.raw.csv" 2>&1
    grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Registers Per" "$rep.details.txt" | head -8
  done
fi
if [[ $steps == *" bench "* ]]; then
  read -ra recipes <<< "${BENCH_RECIPES:-fp8}"
  timeout 280 python3 bench/attention_bench.py --recipes "${recipes[@]}" --cute --cute-tiles "${tiles[@]}" \
    --out "$out/attention_bench_cute_h200" > "$out/bench.log" 2>&1; echo "bench rc=$?" | tee -a "$out/status.txt"
  grep -v '^{' "$out/bench.log" | tail -40
fi
