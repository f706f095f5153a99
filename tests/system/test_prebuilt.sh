#!/usr/bin/env bash
# scripts/gpu/prebuilt.sh: the binaries carried to the GPU machine are used only for the tree they were
# built from. In a clone of this repository: a pack (a stand-in binary, as pack's tarball and stamp lay
# it out) unpacks into place and prints the environment line; after a source file changes, unpack
# refuses (exit 1, saying why), so gpu_check.sh builds instead. The real pack (make, xz of ~230 MB) is
# left to the development machine: `bash scripts/gpu/prebuilt.sh pack`.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q --local . "$tmp/r" 2>/dev/null || git clone -q . "$tmp/r"
cp scripts/gpu/prebuilt.sh "$tmp/r/scripts/gpu/prebuilt.sh"  # this tree's, committed or not
cd "$tmp/r" || exit 1
h1=$(bash scripts/gpu/prebuilt.sh hash) h2=$(bash scripts/gpu/prebuilt.sh hash)
check "the tree's hash is a sha256 and the same twice ($h1)" '[ ${#h1} -eq 64 ] && [ "$h1" = "$h2" ]'

# the pack as `pack` lays it out: train and a GPU test binary at their paths, libs/ beside them
mkdir -p "$tmp/p/build/gpu_tests" "$tmp/p/libs" .prebuilt
printf '#!/bin/sh\necho prebuilt-train\n' >"$tmp/p/train" && chmod +x "$tmp/p/train"
cp "$tmp/p/train" "$tmp/p/build/gpu_tests/gpu_test_stub"
echo lib >"$tmp/p/libs/libyaml-0.so.2"
python3 -c 'import sys, tarfile
with tarfile.open(sys.argv[1], "w:xz") as t:
    for n in ("train", "build/gpu_tests/gpu_test_stub", "libs"): t.add(sys.argv[2] + "/" + n, arcname=n)' \
  .prebuilt/bins.tar.xz "$tmp/p"
files=$(git ls-files '*.c' '*.h' '*.cu' '*.cuh' '*.cpp' Makefile scripts/deps.sh | LC_ALL=C sort)
{ echo "$h1 test"; echo "$files"; } >.prebuilt/stamp
rm -f train
env_line=$(bash scripts/gpu/prebuilt.sh unpack 2>"$tmp/err"); rc=$?
check "unpack takes a pack of this very tree (exit $rc: $(head -c 200 "$tmp/err"))" '[ $rc -eq 0 ]'
check "unpack puts the binaries in place" \
  '[ "$(./train)" = prebuilt-train ] && [ -x build/gpu_tests/gpu_test_stub ] && [ -f .prebuilt/libs/libyaml-0.so.2 ]'
check "unpack prints the library path to export ($env_line)" \
  '[[ $env_line == "export LD_LIBRARY_PATH="*"/.prebuilt/lib"* ]]'

echo "/* changed */" >>"$(head -n 2 <<<"$files" | tail -n 1)"
bash scripts/gpu/prebuilt.sh unpack >/dev/null 2>"$tmp/err"; rc=$?
check "unpack refuses once a source file changed (exit $rc: $(head -c 200 "$tmp/err"))" \
  '[ $rc -eq 1 ] && grep -q "changed since pack" "$tmp/err"'
rm -rf .prebuilt
bash scripts/gpu/prebuilt.sh unpack >/dev/null 2>"$tmp/err"; rc=$?
check "unpack says so where nothing was carried" '[ $rc -eq 1 ] && grep -q "nothing carried" "$tmp/err"'
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
