#!/usr/bin/env bash
# Environment for training launches; sourced by the launchers. Every value can be overridden by
# exporting it before the launch. (Sourced file: no shebang effect, kept for shellcheck.)

# NCCL: surface errors instead of hanging, modest logging.
export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# Set NCCL_SOCKET_IFNAME / NCCL_IB_HCA for your fabric if NCCL picks the wrong interface.
# NVLink SHARP (multicast) stays off unless you ask for it: some shared hosts forbid it.
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"

# CUDA_DEVICE_MAX_CONNECTIONS=1 orders kernel launches so that megatron-core can overlap TP/CP
# communication with compute; it only matters (and is only set) when TP > 1 or CP > 1.
# Pass TP / CP to the launcher with the values in your config.
if [ "${TP:-1}" -gt 1 ] || [ "${CP:-1}" -gt 1 ]; then
    export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"
fi

# Threads per rank for CPU-side work (data loading, optimizer on CPU runs).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"

# Exit codes of pretrain_llama.py that mean "saved a checkpoint, run me again" (preempted by
# SIGTERM/SIGUSR1, or the time budget ran out). See training/ (exit codes) and README.
export PRETRAIN_REQUEUE_CODES="${PRETRAIN_REQUEUE_CODES:-3 4}"
# Exit codes that the same command relaunched would meet again, so never requeued, not even after
# the time-limit signal: done, configuration error, non-finite stop, out of GPU memory.
export PRETRAIN_FINAL_CODES="${PRETRAIN_FINAL_CODES:-0 2 5 6}"

_code_in() {
    local code="$1" c
    for c in $2; do
        [ "$code" = "$c" ] && return 0
    done
    return 1
}
is_requeue_code() { _code_in "$1" "${PRETRAIN_REQUEUE_CODES}"; }
is_final_code() { _code_in "$1" "${PRETRAIN_FINAL_CODES}"; }

# run_forwarding_signals SIGNAL COMMAND...: run COMMAND (torchrun, or srun of the node script) in
# the background, forward SIGTERM/SIGUSR1 to it as SIGNAL (TERM, or USR1 for srun: srun turns a
# SIGTERM it receives into SIGKILL of every task, "srun: forcing job termination", and passes USR1
# on) and wait until it has really exited: a trapped signal interrupts `wait`, and this shell must
# outlive the checkpoint save, or Slurm ends the step and kills the workers mid-save. (An argument,
# not a variable: `VAR=x function` exports VAR to the commands the function runs, and the node
# script under srun would then forward USR1 to torchrun too, which ignores it.)
# Sets LAUNCH_EXIT_CODE: the code rank 0 of pretrain_llama.py wrote to $PRETRAIN_EXIT_FILE if there
# is one (torchrun reports any worker failure as 1, srun the launcher's code), else the command's;
# and LAUNCH_SIGNALLED: 1 if a signal was forwarded, else 0.
run_forwarding_signals() {
    local fwd="$1"
    shift
    case "$fwd" in
        TERM | USR1) ;;
        *)
            echo "launch: run_forwarding_signals $fwd: the signal to forward is TERM or USR1" >&2
            return 2
            ;;
    esac
    "$@" &
    local pid=$!
    # shellcheck disable=SC2034  # read by the launchers that source this file
    LAUNCH_SIGNALLED=0
    # shellcheck disable=SC2064  # $pid and $fwd are expanded now, on purpose
    trap "echo 'launch: TERM/USR1 received: asking the training run to save and exit' >&2; LAUNCH_SIGNALLED=1; kill -$fwd $pid 2>/dev/null || true" TERM USR1
    set +e
    wait "$pid"
    LAUNCH_EXIT_CODE=$?
    while kill -0 "$pid" 2>/dev/null; do
        wait "$pid"
        LAUNCH_EXIT_CODE=$?
    done
    set -e
    trap - TERM USR1
    if [ -s "${PRETRAIN_EXIT_FILE:-}" ]; then
        LAUNCH_EXIT_CODE="$(head -c 16 "$PRETRAIN_EXIT_FILE" | tr -dc '0-9')"
        LAUNCH_EXIT_CODE="${LAUNCH_EXIT_CODE:-1}"
    fi
}
