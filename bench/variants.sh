#!/usr/bin/env bash
# Same-run A/B of several commits: the trees of git refs side by side in one device call, so that
# their numbers come from one machine and one run (numbers from different runs are not compared).
#
#   on the CPU machine, in the checkout's root:
#       bash bench/variants.sh prepare main st=some-branch qk=other-branch
#         writes .variants/<name>/ (the tree of each ref without results/, and its commit in
#         .variants/<name>/COMMIT); NAME=REF names a variant, a bare REF is named after itself
#         (/ -> _); .variants/ is ignored (.git/info/exclude) and travels with `carry .variants`
#   on the GPU machine, after bench/cute_session.sh A and B (PYTHONPATH as there):
#       bash bench/variants.sh run 'python3 bench/attention_bench.py --recipes fp8 --cute --out "$VOUT/bench"'
#         runs the command in each variant's folder, in the order prepared, with BENCH_COMMIT set to
#         its commit and VOUT to $OUT/<name> (created); VARIANT_TIMEOUT (300 s) per variant;
#         VARIANTS ("name ...") runs a subset
set -uo pipefail
mode=${1:?usage: bash bench/variants.sh prepare [NAME=]REF ... | run COMMAND}; shift
root=.variants
case $mode in
  prepare)
    [[ $# -gt 0 ]] || { echo "variants: prepare needs at least one git ref" >&2; exit 2; }
    names=(); commits=()
    for spec in "$@"; do  # every ref checked before anything prepared earlier is replaced
      if [[ $spec == *=* ]]; then name=${spec%%=*}; ref=${spec#*=}; else name=${spec//\//_}; ref=$spec; fi
      [[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "variants: name '$name' may hold only letters, digits, . _ -" >&2; exit 2; }
      commit=$(git rev-parse --short "$ref^{commit}" 2> /dev/null) || { echo "variants: '$ref' is not a git ref" >&2; exit 2; }
      names+=("$name"); commits+=("$commit")
    done
    git check-ignore -q "$root/x" || echo "/$root/" >> .git/info/exclude
    rm -rf "$root"; mkdir -p "$root"
    for i in "${!names[@]}"; do
      name=${names[$i]}; commit=${commits[$i]}
      mkdir -p "$root/$name"
      git archive "$commit" -- . ':!results' | tar x -C "$root/$name" || exit 2
      echo "$commit" > "$root/$name/COMMIT"
      echo "$name" >> "$root/ORDER"; echo "$name $commit"
    done
    du -sh "$root"
    ;;
  run)
    cmd=${1:?usage: bash bench/variants.sh run COMMAND}
    out="${OUT:-variant-logs}"; mkdir -p "$out"; out=$(cd "$out" && pwd)
    names=${VARIANTS:-$(cat "$root/ORDER" 2> /dev/null)}
    [[ -n $names ]] || { echo "variants: no $root/ here: prepare on the CPU machine and carry $root" >&2; exit 2; }
    for name in $names; do
      [[ -f $root/$name/COMMIT ]] || { echo "variants: $root/$name is not a prepared variant" >&2; exit 2; }
      mkdir -p "$out/$name"
      (cd "$root/$name" && BENCH_COMMIT=$(cat COMMIT) VOUT="$out/$name" timeout "${VARIANT_TIMEOUT:-300}" bash -c "$cmd") \
        > "$out/$name/variant.log" 2>&1
      rc=$?; echo "variant $name ($(cat "$root/$name/COMMIT")) rc=$rc" | tee -a "$out/status.txt"
    done
    ;;
  *) echo "variants: mode must be prepare or run, got '$mode'" >&2; exit 2 ;;
esac
