#!/usr/bin/env bash
# Re-cut the Transformer Engine core wheel of a te_bundle.sh bundle into parts of PART_MB MiB (default
# 48), so that one part and the checkout travel in one device call: the transfer limit is 64 MiB for
# the carried paths and the working tree together, and te_bundle.sh's 60 MiB parts left too little
# room once the tree grew to ~6 MB (the device tool refused the call, 2026-12-03).
#   bash bench/te_bundle_parts.sh [.te-bundle]
# Rewrites BUNDLE/te-core.part-NN and te-core.count; te-core.name and te-wheels/ are unchanged.
set -euo pipefail
bundle=${1:-.te-bundle}
mb=${PART_MB:-48}
[[ -f $bundle/te-core.name ]] || { echo "te_bundle_parts: $bundle has no te-core.name: build it with te_bundle.sh" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat "$bundle"/te-core.part-* > "$tmp/core.whl"
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).testzip()" "$tmp/core.whl" \
  || { echo "te_bundle_parts: the joined parts are not a valid wheel" >&2; exit 1; }
rm -f "$bundle"/te-core.part-*
split -b "${mb}M" -d "$tmp/core.whl" "$bundle/te-core.part-"
ls "$bundle"/te-core.part-* | wc -l | tr -d " " > "$bundle/te-core.count"
echo "te_bundle_parts: $(cat "$bundle/te-core.count") parts of at most $mb MiB in $bundle"
