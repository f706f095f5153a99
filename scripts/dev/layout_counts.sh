#!/usr/bin/env bash
# The layout figures docs/architecture.md quotes, for a commit (default HEAD): the file-level `g_`
# variables of the sources (tests excluded) by folder, `#ifdef HAVE_CUDA` in train.c, the lines of the
# FP4 linear layer that name a format, and the files directly in each folder.
#   bash scripts/dev/layout_counts.sh [REV]
set -u
cd "$(dirname "$0")/../.." || exit 1
rev=${1:-HEAD}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
git archive "$rev" | tar -x -C "$tmp" || exit 1
cd "$tmp" || exit 1
echo "commit $(cd - >/dev/null && git rev-parse --short "$rev")"
mapfile -t src < <(find . -type f \( -name '*.c' -o -name '*.cu' -o -name '*.cpp' \) -not -path './tests/*' | sort)
vars=$(grep -HE '^static[^(]*\bg_[a-z_0-9]+' "${src[@]}" |
  awk -F: '{n = split($0, w, /[^A-Za-z_0-9]+/); for (i = 1; i <= n; i++) if (w[i] ~ /^g_/) print $1, w[i]}' | sort -u)
echo "file-level g_ variables: $(printf '%s\n' "$vars" | grep -c .)"
printf '%s\n' "$vars" | awk '{d = $1; sub(/^\.\//, "", d); sub(/\/[^/]*$/, "", d); c[d]++} END {for (k in c) printf "  %-12s %d\n", k, c[k]}' | sort
echo "#ifdef HAVE_CUDA in train.c: $(grep -c 'HAVE_CUDA' train.c)"
lin=$(ls model/cuda/linear_fp4.cu model/linear_fp4.cu 2>/dev/null | head -n 1)
echo "lines naming a format (FMT_MXFP4, FMT_NVFP4) in $lin: $(grep -c 'FMT_MXFP4\|FMT_NVFP4' "$lin")"
echo "files directly in each folder:"
find . -mindepth 2 -type f | sed 's|^\./||; s|/[^/]*$||' | grep -v '^tests/fuzz/corpus\|^docs/results\|^configs/' |
  sort | uniq -c | awk '{printf "  %-16s %d\n", $2, $1}'
echo "  (top level)      $(find . -maxdepth 1 -type f | wc -l)"
