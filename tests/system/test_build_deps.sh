#!/usr/bin/env bash
# The build's dependency step (scripts/deps.sh, run by make): a missing C library stops make before
# it compiles anything, naming the package and the command that installs it; a CUDA backend that
# cannot be built leaves a CPU build and a one-line reason. Uses a compiler wrapper that cannot
# find zstd.h, an empty unpack prefix and a frontend path that does not exist, with AUTO_DEPS=0
# (nothing is installed).
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/cc" <<'CC'
#!/usr/bin/env bash
# gcc, except that a preprocessed input including zstd.h fails as if the header were missing.
if [ "${*: -1}" = "-" ]; then in=$(cat); if grep -q 'zstd.h' <<<"$in"; then exit 1; fi; exec gcc "$@" <<<"$in"; fi
exec gcc "$@"
CC
chmod +x "$tmp/cc"

# A real make (not -n): were the check to pass wrongly, it would compile into $tmp/b1.
out=$(AUTO_DEPS=0 DEPS_LOCAL_ROOT="$tmp/none" make CC="$tmp/cc" BUILD="$tmp/b1" 2>&1); rc=$?
check "a missing libzstd-dev stops make" '[ $rc -ne 0 ] && echo "$out" | grep -q "missing build dependencies"'
check "the message names the package and the install command" \
  'echo "$out" | grep -q "error: missing libzstd-dev" && echo "$out" | grep -q "sudo apt-get install libzstd-dev"'
check "nothing was compiled" '! find "$tmp/b1" -name "*.o" | grep -q . && ! echo "$out" | grep -q -- " -c "'
check "AUTO_DEPS=0 is said to install nothing" 'echo "$out" | grep -q "AUTO_DEPS=0 installs nothing"'

nvcc_path=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
out=$(AUTO_DEPS=0 make -n BUILD="$tmp/b2" CUDNN_FE="$tmp/no_frontend/include" 2>&1); rc=$?
check "without the cuDNN frontend make still plans the CPU build" '[ $rc -eq 0 ] && echo "$out" | grep -q "train"'
check "... and builds no CUDA object" '! echo "$out" | grep -q "\.cu\.o"'
check "deps.mk says the CUDA backend is off" 'grep -q "^CUDA_BUILD := 0" "$tmp/b2/deps.mk"'
if [ -n "$nvcc_path" ]; then
  check "with nvcc there, one note says why" \
    'echo "$out" | grep -q "note: the CUDA backend is not built, ./train runs on the CPU only: .*cuDNN frontend headers not in $tmp/no_frontend/include"'
else
  check "without nvcc, deps.mk says so" 'grep -q "^CUDA_WHY := no nvcc found" "$tmp/b2/deps.mk"'
fi
echo "$pass passed, $fail failed"
