#!/usr/bin/env bash
# Run pretrain_llama.py on ONE node with torchrun, as one srun task of launch/slurm_8x8.sbatch or
# by hand on a single machine. Arguments are passed to pretrain_llama.py unchanged.
#
#   launch/torchrun_node.sh --config configs/llama3_1_8b_100b_fp8.yaml
#
# Environment (all optional):
#   NPROC_PER_NODE  processes on this node (default: number of visible GPUs, else 1)
#   NNODES          nodes in the job (default SLURM_NNODES or 1)
#   NODE_RANK       this node's rank (default SLURM_NODEID or 0)
#   MASTER_ADDR     rendezvous host (required when NNODES > 1; the sbatch script sets it)
#   MASTER_PORT     rendezvous port (default 29500)
#   RDZV_ID         rendezvous id (default SLURM_JOB_ID or "local")
#   PYTHON          interpreter (default .venv/bin/python if present, else python3)
#   TORCHRUN_EXTRA  extra torchrun flags, e.g. "--master-port=29600" (word-split on purpose)
#   PRETRAIN_EXIT_FILE  where rank 0 writes pretrain_llama.py's exit code (default
#                   logs/exit-$RDZV_ID.code). torchrun reports any worker exit != 0 as 1, so the
#                   distinct codes (3 preempted, 4 time budget, ...) travel through this file; this
#                   script exits with the code found there.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
# shellcheck source=launch/env.sh
source "$here/env.sh"

if [ -z "${NPROC_PER_NODE:-}" ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        NPROC_PER_NODE="$( (nvidia-smi -L 2>/dev/null || true) | wc -l)"
    fi
    [ "${NPROC_PER_NODE:-0}" -gt 0 ] || NPROC_PER_NODE=1
fi
NNODES="${NNODES:-${SLURM_NNODES:-1}}"
NODE_RANK="${NODE_RANK:-${SLURM_NODEID:-0}}"
MASTER_PORT="${MASTER_PORT:-29500}"
RDZV_ID="${RDZV_ID:-${SLURM_JOB_ID:-local}}"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi

if [ "$NNODES" -gt 1 ]; then
    if [ -z "${MASTER_ADDR:-}" ]; then
        echo "torchrun_node.sh: NNODES=$NNODES needs MASTER_ADDR (the first node's hostname)" >&2
        exit 2
    fi
    rdzv=(--rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}" --rdzv-id="$RDZV_ID")
else
    rdzv=(--standalone)
fi

export PRETRAIN_EXIT_FILE="${PRETRAIN_EXIT_FILE:-$repo/logs/exit-${RDZV_ID}.code}"
mkdir -p "$(dirname "$PRETRAIN_EXIT_FILE")"
if [ "$NNODES" -eq 1 ]; then
    rm -f "$PRETRAIN_EXIT_FILE"  # multi-node: the sbatch script clears it before srun
fi

# shellcheck disable=SC2206  # TORCHRUN_EXTRA is split into flags on purpose
extra=(${TORCHRUN_EXTRA:-})
cd "$repo"
echo "torchrun_node.sh: node ${NODE_RANK}/${NNODES}, ${NPROC_PER_NODE} procs, rendezvous ${rdzv[*]}" >&2
# torchrun starts with SIGUSR1 ignored: under srun, Slurm signals the step's processes (the task's
# process group, or with proctrack/cgroup all of them), torchrun among them, and torchrun has no
# handler for USR1, whose default action would end it at once and leave its workers saving with
# nothing waiting for them. This script's trap turns USR1 into SIGTERM to torchrun, which passes it
# to the workers; pretrain_llama.py installs its own USR1 handler, so a worker signalled directly
# stops the same way.
# shellcheck disable=SC2016  # "$@" is the inner shell's
run_forwarding_signals TERM bash -c 'trap "" USR1; exec "$@"' torchrun \
    "$PYTHON" -m torch.distributed.run --nnodes="$NNODES" --node-rank="$NODE_RANK" \
    --nproc-per-node="$NPROC_PER_NODE" "${rdzv[@]}" "${extra[@]}" pretrain_llama.py "$@"
code="$LAUNCH_EXIT_CODE"
echo "torchrun_node.sh: node ${NODE_RANK} exit code ${code}" >&2
exit "$code"
