#!/usr/bin/env bash
# The documents point at what exists: every relative link in README.md and docs/ resolves, every log
# path they name is in docs/results/, and docs/results/README.md lists every log with the script that
# printed it (scripts/dev/results_index.py --check). Then the same checks on a copy with a broken link,
# a missing log, an unlisted log and a log of unknown kind, which must each be reported.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
out=$(python3 scripts/dev/results_index.py --check 2>&1); rc=$?
check "results_index --check passes on the tree${out:+: $(grep -v ' 0 problems' <<<"$out" | head -n 3 | tr '\n' ' ')}" '[ $rc -eq 0 ]'
n_logs=$(find docs/results -mindepth 2 -type f | wc -l)
n_rows=$(grep -c '^| \[' docs/results/README.md)
check "the index lists every log ($n_rows rows, $n_logs logs)" '[ "$n_rows" -eq "$n_logs" ] && [ "$n_logs" -gt 100 ]'
check "README.md links the index" 'grep -q "docs/results/README.md" README.md'

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/scripts" && cp -r README.md docs "$tmp/" && cp -r scripts/dev "$tmp/scripts/"
printf '\nSee [the plan](no_such_plan.md) and docs/results/2026-11-30/no_such_bench_0000000.log.\n' >>"$tmp/docs/build.md"
d=$(ls docs/results | grep -E '^[0-9]{4}-' | head -n 1)
echo x >"$tmp/docs/results/$d/bf16_bench_1234567.log"   # listed by no one yet: the listing is out of date
echo x >"$tmp/docs/results/$d/mystery_1234567.log"      # and no rule says what printed it
out=$(RESULTS_INDEX_ROOT=$tmp python3 "$tmp/scripts/dev/results_index.py" --check 2>&1); rc=$?
check "a broken link is reported with its file and line" 'grep -q "docs/build.md:[0-9]*: link to no_such_plan.md" <<<"$out"'
check "a missing log is reported" 'grep -q "names docs/results/2026-11-30/no_such_bench_0000000.log, which matches no file" <<<"$out"'
check "an unlisted log makes the listing out of date" 'grep -q "listing is out of date" <<<"$out"'
check "a log of unknown kind is reported" 'grep -q "mystery_1234567.log: no rule" <<<"$out"'
check "--check fails on them" '[ $rc -ne 0 ]'
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
