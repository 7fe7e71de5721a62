# shellcheck shell=bash
# Sourced by bench/ncu_light.sh, bench/ncu_l2.sh and bench/cute_session.sh's profile step.
#   ncu_path            prints Nsight Compute's ncu (on PATH, else the newest under /opt/nvidia); nothing if none
#   ncu_kernel VARIANT  prints the name of the kernel that bench/cute_profile.py --variant VARIANT launches
ncu_path() { command -v ncu || find /opt/nvidia -name ncu -type f 2> /dev/null | sort | tail -1; }
ncu_kernel() {
  case $1 in
    fa4_bf16) echo FlashAttentionForwardSm90 ;; fp8_bwd) echo FP8BackwardSm90 ;;
    fa4_bf16_bwd) echo FlashAttentionBackwardSm90 ;; *) echo FP8ForwardSm90 ;;
  esac
}
