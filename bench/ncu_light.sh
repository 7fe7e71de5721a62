#!/usr/bin/env bash
# Nsight Compute, light sections, of one warm launch of bench/cute_profile.py's VARIANT (default
# fp8_bwd) at B4 H32/8 S4096 causal, from the working directory's tree; writes NAME.details.txt and
# NAME.sass.csv.gz into DEST. For same-run A/Bs of trees: bench/variants.sh run 'bash <this> "$VOUT" x'.
#   bash bench/ncu_light.sh DEST NAME [VARIANT] [SHAPE]
set -uo pipefail
dest=${1:?usage: ncu_light.sh DEST NAME [VARIANT] [SHAPE]}; name=${2:?}; variant=${3:-fp8_bwd}; shape=${4:-4,32,8,4096}
# shellcheck source=bench/ncu_lib.sh
source "$(dirname "$0")/ncu_lib.sh"
ncu=$(ncu_path)
[[ -n $ncu ]] || { echo "ncu_light: ncu not found" >&2; exit 2; }
k=$(ncu_kernel "$variant")
mkdir -p "$dest"; rep="$dest/$name"
"$ncu" --clock-control none -k "regex:$k" --launch-skip 2 --launch-count 1 --section SpeedOfLight \
  --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters \
  --section InstructionStats --import-source no -f -o "$rep" python3 bench/cute_profile.py --variant "$variant" \
  --shape "$shape" --tiles 128,128,2 --causal > "$rep.log" 2>&1
echo "ncu $name rc=$?"
"$ncu" -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
"$ncu" -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$rep.sass.csv.gz"
rm -f "$rep.ncu-rep"
