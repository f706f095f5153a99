#!/usr/bin/env bash
# The source style (.clang-format): no tracked C, C++ or CUDA line passes the 120-column limit, and,
# where the pinned clang-format 14 is installed (Debian 12's; scripts/deps.sh test installs it),
# every tracked source file is exactly as clang-format writes it. Other clang-format versions
# format some constructs differently, so with one of them only the column check runs.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh' '*.cpp' | grep -v '^tests/fuzz/corpus/')
check "the sources are listed" '[ ${#files[@]} -gt 100 ]'
long=$(awk 'length > 120 {print FILENAME ":" FNR ": " length " columns"}' "${files[@]}")
check "no source line is longer than 120 columns${long:+: $(head -n 3 <<<"$long" | tr '\n' ' ')}" '[ -z "$long" ]'
check ".clang-format states the same limit" 'grep -q "^ColumnLimit: 120$" .clang-format'
cf=$(command -v clang-format-14 || command -v clang-format)
if [ -n "$cf" ] && "$cf" --version | grep -q 'version 14\.'; then
  bad=$("$cf" --dry-run "${files[@]}" 2>&1 | grep -o '^[^:]*:[0-9]*' | sort -u)
  check "every source file is as clang-format 14 writes it${bad:+: $(head -n 5 <<<"$bad" | tr '\n' ' ')}" '[ -z "$bad" ]'
  # the check can fail: a line joined that the style splits is reported
  printf 'int main(void) {\n  int x = 1; int y = 2;\n  return x + y;\n}\n' >"${TMPDIR:-/tmp}/style_probe.c"
  check "clang-format reports a badly formatted file" \
    '"$cf" --style=file:.clang-format --dry-run "${TMPDIR:-/tmp}/style_probe.c" 2>&1 | grep -q warning'
  rm -f "${TMPDIR:-/tmp}/style_probe.c"
else
  echo "note: clang-format 14 is not installed (${cf:-none found}): only the column limit was checked"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
