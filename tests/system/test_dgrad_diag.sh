#!/usr/bin/env bash
# The Dgrad diagnostic's rows and output (./train CONFIG --dgrad-diagnostic N, run/dgrad_diag.c) on the
# tiny model, CPU backend (micro-batches of 8 sequences x 64 tokens): --dgrad-tokens takes the first
# whole sequences of each micro-batch (fewer rows: energies no larger than the whole batch's, every
# comparison still made); stdout is flushed line by line (a killed run keeps what it printed) and
# progress with an ETA goes to stderr. Its first checks (12 comparisons, a row per block and component,
# an FP4 recipe refused) are in test_train.sh; the per-linear product is test_dgrad_diag.c's.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
diag=(./train configs/tiny.yaml --set parallel.backend=cpu --set parallel.threads=2 --dgrad-draws 2)

"${diag[@]}" --dgrad-diagnostic 2 >"$tmp/all.out" 2>"$tmp/all.err"; rc=$?
check "the default (2048 tokens) takes all 8 sequences of a 512-token micro-batch" \
  '[ $rc -eq 0 ] && grep -q "Dgrads on the first 8 sequence(s) (512 tokens) of each" "$tmp/all.out"'
"${diag[@]}" --dgrad-diagnostic 2 --dgrad-tokens 0 >"$tmp/zero.out" 2>/dev/null
check "--dgrad-tokens 0 (all rows) prints the same table" 'diff <(grep "^|\|^DGRAD" "$tmp/all.out") <(grep "^|\|^DGRAD" "$tmp/zero.out")'
check "progress with an ETA on stderr, a line per batch" '[ "$(grep -c "^dgrad diagnostic: batch [12]/2, done in .* eta [0-9]*m[0-9]*s$" "$tmp/all.err")" -eq 2 ]'
check "... and a result line per batch on stdout" '[ "$(grep -c "^dgrad diagnostic batch [12]/2: CTA-local lower in [0-6] of 6, geometric mean E_MX/E_CTA [0-9.]*$" "$tmp/all.out")" -eq 2 ]'

"${diag[@]}" --dgrad-diagnostic 2 --dgrad-tokens 256 >"$tmp/part.out" 2>/dev/null; rc=$?
check "--dgrad-tokens 256 takes 4 whole sequences" '[ $rc -eq 0 ] && grep -q "Dgrads on the first 4 sequence(s) (256 tokens) of each" "$tmp/part.out"'
check "... still 12 comparisons and a finite geometric mean" \
  'grep -Eq "^DGRAD_DIAG comparisons 12, CTA-local lower in [0-9]+, geometric mean E_MX/E_CTA [0-9]+\.[0-9]+ " "$tmp/part.out"'
check "... with a row per block and component" '[ "$(grep -c "^| [12] | \(QKV\|O\|FFN\) | [0-9]" "$tmp/part.out")" -eq 6 ]'
# The first 256 rows are the whole run's first rows (same SR bits, whole CTA-local stripes of 256), so
# each energy is a part of the whole batch's sum: never larger, and smaller in total.
energies() { awk -F'|' '/^\| [12] \|/ { print $4, $5 }' "$1"; }
cmp=$(paste -d' ' <(energies "$tmp/part.out") <(energies "$tmp/all.out") |
  awk '{ if ($1 <= 0 || $2 <= 0 || $1 > $3 || $2 > $4) bad++; p += $1 + $2; a += $3 + $4 } END { print NR, bad + 0, (p < a) }')
check "... every energy positive and at most the whole batch's, the total smaller (rows, bad, smaller: $cmp)" '[ "$cmp" = "6 0 1" ]'
"${diag[@]}" --dgrad-diagnostic 1 --dgrad-tokens 100 >"$tmp/odd.out" 2>/dev/null
check "--dgrad-tokens 100 rounds up to whole sequences (2 x 64)" 'grep -q "first 2 sequence(s) (128 tokens)" "$tmp/odd.out"'
out=$("${diag[@]}" --dgrad-diagnostic 1 --dgrad-tokens -5 2>&1); rc=$?
check "a negative --dgrad-tokens is refused, naming the option" '[ $rc -ne 0 ] && grep -q "dgrad-tokens: -5 must be >= 0" <<<"$out"'

# A run killed in the middle keeps every line it printed: stdout to a file (4 KiB of buffer) is flushed
# line by line, so when stderr (unbuffered) says batch 3 is done, batches 1-3 are in the file.
"${diag[@]}" --dgrad-diagnostic 100000 >"$tmp/kill.out" 2>"$tmp/kill.err" &
pid=$!
wait_for "$tmp/kill.err" "^dgrad diagnostic: batch 3/100000, done"
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
pid=
check "a killed run has its header and its batch lines in the file" \
  'grep -q "^dgrad diagnostic: 100000 micro-batch(es)" "$tmp/kill.out" && [ "$(grep -c "^dgrad diagnostic batch [1-3]/100000: CTA-local lower in" "$tmp/kill.out")" -eq 3 ]'
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
