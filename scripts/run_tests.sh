#!/usr/bin/env bash
# Runs every CPU test program (build/tests/test_*) and test script (tests/system/test_*.sh) from the repo
# root, then prints the totals as the last line: "N passed, N failed". A program that crashes or
# prints no count counts as one failure.
cd "$(dirname "$0")/.." || exit 1
total_pass=0 total_fail=0
run_one() {
  local name=$1; shift
  local out rc t0=$SECONDS
  out=$("$@" 2>&1); rc=$?
  local last
  last=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
  if [ -z "$last" ]; then
    printf '%s\n' "$out" | tail -n 20
    echo "== $name: crashed or printed no count (exit $rc)"
    total_fail=$((total_fail + 1)); return
  fi
  local p f
  p=${last%% passed*}; f=${last#*, }; f=${f%% failed}
  if [ "$f" -gt 0 ] || [ $rc -ne 0 ]; then printf '%s\n' "$out" | grep -E '^FAIL|error' | head -n 30; fi
  [ $rc -ne 0 ] && [ "$f" -eq 0 ] && f=1
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
  printf '== %-28s %5d passed, %d failed  (%ds)\n' "$name" "$p" "$f" $((SECONDS - t0))
}
for t in build/tests/test_*; do
  [ -x "$t" ] && run_one "$(basename "$t")" "$t"
done
for t in tests/system/test_*.sh; do
  [ -f "$t" ] && run_one "$(basename "$t")" bash "$t"
done
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
