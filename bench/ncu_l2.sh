#!/usr/bin/env bash
# Nsight Compute's L2 view of one warm launch of bench/cute_profile.py's VARIANT (default fp8_bwd) at
# B4 H32/8 S4096 causal, from the working directory's tree: the L2 throughput's breakdown (which of
# the L2's metrics is the highest), its sectors by operation (reads, writes, reductions, atomics) and
# the memory workload tables; writes NAME.details.txt and NAME.raw.csv into DEST. Used for
# results/cute_bwd_floor_h100/ (the backward's data movement against the L2's bandwidth); for
# same-run A/Bs of trees: bench/variants.sh run 'bash <this> "$VOUT" x'.
#   bash bench/ncu_l2.sh DEST NAME [VARIANT] [SHAPE]
set -uo pipefail
dest=${1:?usage: ncu_l2.sh DEST NAME [VARIANT] [SHAPE]}; name=${2:?}; variant=${3:-fp8_bwd}; shape=${4:-4,32,8,4096}
# shellcheck source=bench/ncu_lib.sh
source "$(dirname "$0")/ncu_lib.sh"
ncu=$(ncu_path)
[[ -n $ncu ]] || { echo "ncu_l2: ncu not found" >&2; exit 2; }
k=$(ncu_kernel "$variant")
metrics=breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,lts__t_sectors.sum
metrics+=,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum
metrics+=,lts__t_sectors_srcunit_tex.sum,gpc__cycles_elapsed.max,dram__bytes.sum,sm__cycles_elapsed.avg
mkdir -p "$dest"; rep="$dest/$name"
"$ncu" --clock-control none -k "regex:$k" --launch-skip 2 --launch-count 1 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --metrics "$metrics" \
  -f -o "$rep" python3 bench/cute_profile.py --variant "$variant" --shape "$shape" --tiles 128,128,2 --causal \
  > "$rep.log" 2>&1
echo "ncu_l2 $name rc=$?"
"$ncu" -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
"$ncu" -i "$rep.ncu-rep" --page raw --csv > "$rep.raw.csv" 2>&1
rm -f "$rep.ncu-rep"
