#!/usr/bin/env bash
# Binaries built here, carried to the GPU machine, so that a call there skips its build (90-100 s of a
# 600 s call on 16 cores; the device tool's budget is what limits a session's measurements).
#
#   bash scripts/gpu/prebuilt.sh pack      (here) make, then .prebuilt/bins.tar.xz: ./train and the GPU test
#                                          binaries, the shared libraries they load that the GPU machine may
#                                          lack (libyaml, libzstd, libpcre2-8), and .prebuilt/stamp: the hash
#                                          of every build input (sources, Makefile, scripts/deps.sh) as packed
#   bash scripts/gpu/prebuilt.sh unpack    (there, gpu_check.sh's build step) only where the tree's hash equals
#                                          the stamp's: the binaries into place, the libraries the loader
#                                          does not find into .prebuilt/lib; prints the environment to source
#   bash scripts/gpu/prebuilt.sh hash      the tree's hash
#
# Carry .prebuilt (about 21 MB with every GPU test, both archs) beside .deps: run's carry takes 64 MiB in all.
# A tree that changed since pack gets the normal build (unpack exits 1 and says why). The binaries keep
# the run paths of this machine (CUDA 13.0 in /usr/local/cuda, as there); cuDNN comes from the newest
# found there (`scripts/deps.sh cudnn-dir`, the build's own rule: 9.19 from PyTorch's wheel on the H200
# machine), by LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."
P=.prebuilt
LIBS="libyaml-0.so.2 libzstd.so.1 libpcre2-8.so.0"

# Every build input, in a fixed order, as "sha256  path" lines hashed once more. git lists them here;
# the GPU machine's copy may have stale git metadata, so unpack hashes the list the stamp recorded.
inputs() { git ls-files '*.c' '*.h' '*.cu' '*.cuh' '*.cpp' Makefile scripts/deps.sh | LC_ALL=C sort; }
tree_hash() {
  local list=${1:-$(inputs)}
  # shellcheck disable=SC2086
  sha256sum $list | sha256sum | cut -d' ' -f1
}

case "${1:-}" in
  hash) tree_hash ;;
  pack)
    make -j"$(nproc)" all >/dev/null || { echo "prebuilt: make failed" >&2; exit 1; }
    grep -q '^CUDA_BUILD := 1' build/deps.mk || { echo "prebuilt: this build has no CUDA backend" >&2; exit 1; }
    rm -rf "$P" && mkdir -p "$P/libs"
    for l in $LIBS; do
      f=$(ldconfig -p | awk -v l="$l" '$1 == l {print $NF; exit}')
      [ -n "$f" ] && cp -L "$f" "$P/libs/$l"
    done
    bins=(train)
    for t in build/gpu_tests/gpu_test_*; do [[ $t == *.[od] ]] || bins+=("$t"); done
    tar cf - "${bins[@]}" -C "$P" libs | xz -T"$(nproc)" -6 >"$P/bins.tar.xz"
    rm -rf "$P/libs"
    files=$(inputs)
    { echo "$(tree_hash "$files") $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo +dirty)"
      echo "$files"; } >"$P/stamp"
    echo "prebuilt: $(du -h "$P/bins.tar.xz" | cut -f1) in $P/bins.tar.xz, ${#bins[@]} binaries, stamp $(head -c 12 "$P/stamp")"
    ;;
  unpack)
    [ -f "$P/bins.tar.xz" ] && [ -f "$P/stamp" ] || { echo "prebuilt: nothing carried ($P)" >&2; exit 1; }
    want=$(head -n 1 "$P/stamp" | cut -d' ' -f1)
    have=$(tree_hash "$(tail -n +2 "$P/stamp")" 2>/dev/null || echo none)
    [ "$want" = "$have" ] || { echo "prebuilt: the tree changed since pack ($(head -n 1 "$P/stamp")): building" >&2; exit 1; }
    rm -rf "$P/libs" "$P/lib" && mkdir -p "$P/lib" build/gpu_tests
    # Python's tarfile: the GPU machine may lack the xz tool (it lacks zstd's)
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$P/bins.tar.xz" "$P/x"
    mv "$P/x/libs" "$P/libs" && cp -a "$P/x/." . && rm -rf "$P/x"
    cudnn=$(bash scripts/deps.sh cudnn-dir 2>/dev/null || true)  # the build's rule: the newest cuDNN 9 here
    # only the libraries this machine's loader does not find
    for l in $(LD_LIBRARY_PATH=${cudnn:-} ldd ./train | awk '/not found/ {print $1}'); do
      [ -f "$P/libs/$l" ] || { echo "prebuilt: ./train needs $l, which neither this machine nor the pack has" >&2; exit 1; }
      cp "$P/libs/$l" "$P/lib/"
    done
    echo "export LD_LIBRARY_PATH=${cudnn:+$cudnn:}$(pwd)/$P/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    ;;
  *) echo "usage: scripts/gpu/prebuilt.sh pack|unpack|hash" >&2; exit 2 ;;
esac
