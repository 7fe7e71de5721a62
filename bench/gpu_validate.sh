#!/usr/bin/env bash
# One call on the H200 (the device tool): install the carried wheels, run every GPU test, and the
# default main job. Logs go to $OUT (or ./gpu-logs). Usage: bash bench/gpu_validate.sh [STAGES...]
# Stages: attention model training fidelity main (default: all).
set -uo pipefail
out="${OUT:-gpu-logs}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
stages=("${@:-attention model training fidelity main}")
# shellcheck disable=SC2048,SC2086
for stage in ${stages[*]}; do
    case "$stage" in
        attention) timeout 300 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -s > "$out/gpu_attention.log" 2>&1 ;;
        model) timeout 200 python3 -m pytest -q -m gpu tests/model -p no:cacheprovider > "$out/gpu_model.log" 2>&1 ;;
        training) timeout 300 python3 -m pytest -q -m gpu tests/training -p no:cacheprovider > "$out/gpu_training.log" 2>&1 ;;
        fidelity) FP4_ATTENTION_TRITON_DIRECT_P=1 timeout 200 python3 tools/fidelity.py --backend triton --device cuda --out "$out/fidelity_triton" > "$out/fidelity.log" 2>&1 ;;
        main) timeout 300 python3 pretrain_llama.py runtime.output_dir=/tmp/main_job > "$out/main_job.log" 2>&1 ;;
        *) echo "unknown stage $stage" >&2 ;;
    esac
    echo "stage $stage: exit $?"
    tail -3 "$out"/*"${stage}"*.log 2>/dev/null | tail -3
done
