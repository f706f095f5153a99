#!/usr/bin/env bash
# Crash safety of ./train (CPU backend): a run is killed with SIGKILL many times and resumed with
# --resume after each kill until it completes. Checkpoints are written every 2 steps and stretched
# with the test hook TRAIN_CKPT_SLOW_MS (run/checkpoint.h). The kills wait for events, not times
# (a loaded machine changes nothing): every other run is killed while one of its saves is in
# progress (its temp file is there), the others once they log a step 1-6 steps past their
# checkpoint. Asserts: every resume loads the newest complete checkpoint on disk (never a partial
# one: no "skipping invalid checkpoint" warning, and never an older one), the kills timed to a save
# did interrupt one, and every loss logged across all the pieces (a resumed run appends to the
# JSONL log, so steps after a checkpoint may appear twice) equals the uninterrupted run's bit for
# bit. CRASH_KILLS (30) and CRASH_STEPS (150) size the work.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
kills_wanted=${CRASH_KILLS:-30} steps=${CRASH_STEPS:-150}
# CRASH_BACKEND=cuda CRASH_ARGS="--set precision.recipe=mxfp4" runs the same test on a GPU
# (scripts/gpu/gpu_check.sh crash) with the default settings: parallel.deterministic (true) makes GPU
# runs bit-reproducible once every process takes the same GEMM algorithms, so the uninterrupted run
# and the crashed one share one record of them (parallel.gemm_plans, docs/determinism.md). The CPU
# backend writes none.
backend=${CRASH_BACKEND:-cpu}
RANDOM=12345  # the kill steps follow a fixed sequence
C=(configs/tiny.yaml --set parallel.backend=$backend --set parallel.threads=2 --set logging.interval=1
   --set eval.interval=0 --set schedule.total_steps=$steps --set parallel.gemm_plans="$tmp/gemm_plans" ${CRASH_ARGS:-})

./train "${C[@]}" --set logging.file="$tmp/ref.jsonl" >"$tmp/ref.out" 2>&1
check "the uninterrupted run succeeds" '[ $? -eq 0 ] && [ "$(grep -c "\"loss\"" "$tmp/ref.jsonl")" -eq $steps ]'

R=("${C[@]}" --set checkpoint.dir="$tmp/ck" --set checkpoint.interval=2 --set logging.file="$tmp/crash.jsonl" --resume)
newest() { ls "$tmp/ck"/ckpt_*.bin 2>/dev/null | sort | tail -n 1; }  # 8-digit steps: sorted by name
step_of() { local s=${1##*/ckpt_}; s=${s%%.bin*}; echo $((10#${s:-0})); }
# A save of this run in progress: a temp file of a step after the one it resumed from (a killed
# run's temp file can still be there from before).
saving_after() {
  local f; for f in "$tmp/ck"/ckpt_[0-9]*.bin.tmp; do [ -e "$f" ] && [ "$(step_of "$f")" -gt "$1" ] && return 0; done; return 1
}
# Each run is killed at an event, not after a time, so that a loaded machine changes nothing:
# odd runs while a save of theirs is in progress, even runs once they log a step 1-6 steps past
# their checkpoint (inside a step or a save, wherever the kill lands).
kills=0 in_save=0 bad_resume=0 invalid=0 runs=0 finished=0 t0=$SECONDS
while [ $kills -lt "$kills_wanted" ]; do
  want=$(newest); base=0; [ -n "$want" ] && base=$(step_of "$want")
  runs=$((runs + 1)); out="$tmp/run$runs.out"
  TRAIN_CKPT_SLOW_MS=60 ./train "${R[@]}" >"$out" 2>&1 &
  pid=$!
  if [ $((runs % 2)) -eq 1 ]; then wait_until "saving_after $base || ! kill -0 $pid 2>/dev/null"
  else target=$((base + 1 + RANDOM % 6)); wait_until "[ \$(last_step $out) -ge $target ] || ! kill -0 $pid 2>/dev/null"; fi
  if kill -KILL $pid 2>/dev/null; then
    wait $pid 2>/dev/null
    kills=$((kills + 1))
    saving_after "$base" && in_save=$((in_save + 1))  # killed inside a save
  else
    wait $pid; finished=1
  fi
  # What this run resumed from must be the newest complete checkpoint before it started.
  if [ -z "$want" ]; then
    grep -q "resumed from" "$out" && bad_resume=$((bad_resume + 1))
  elif grep -q "resumed from" "$out"; then
    grep -q "resumed from $want at step" "$out" || { bad_resume=$((bad_resume + 1)); echo "run $runs: expected $want"; grep "resumed" "$out"; }
  fi
  grep -q "skipping invalid checkpoint" "$out" && invalid=$((invalid + 1))
  [ $finished -eq 1 ] && break
done
echo "$kills kills in $runs runs ($in_save inside a checkpoint save), $((SECONDS - t0)) s"
want=$(newest)
./train "${R[@]}" >"$tmp/final.out" 2>&1; rc=$?
check "the run completes after the kills" '[ $rc -eq 0 ] && [ -f "$tmp/ck/$(printf "ckpt_%08d.bin" $steps)" ]'
check "the final resume loads the newest checkpoint" '[ -n "$want" ] && grep -q "resumed from $want at step" "$tmp/final.out"'
check "$kills_wanted kills (the run cannot finish first: at most 6 steps per run)" '[ $kills -eq "$kills_wanted" ]'
check "the kills timed to a save landed inside one (at least half of the odd runs' kills)" '[ $in_save -ge $((kills_wanted / 4)) ]'
check "every resume loaded the newest complete checkpoint" '[ $bad_resume -eq 0 ]'
check "no invalid checkpoint was ever found" '[ $invalid -eq 0 ] && ! grep -q "skipping invalid" "$tmp/final.out"'
check "no temp file is left after the final save" '! ls "$tmp/ck"/*.tmp >/dev/null 2>&1'
if [ "$backend" = cpu ]; then
  check "the CPU backend writes no record of GEMM choices" '[ ! -e "$tmp/gemm_plans" ]'
else  # the uninterrupted run recorded its choices; the last piece found them all (nothing new added)
  n_rec=$(grep -o 'recorded in [^ ]* ([0-9]*' "$tmp/final.out" | grep -o '[0-9]*$')
  check "the record was shared: the last run found ${n_rec:-no} recorded GEMM choices, added none" \
    '[ "${n_rec:-0}" -gt 0 ] && [ "$(grep -c . "$tmp/gemm_plans")" -eq $((n_rec + 2)) ]'
fi

# Every logged loss, duplicates included, must equal the reference's for its step; every step is logged.
awk 'match($0, /"step": [0-9]+, "loss": [^,]+,/) { split(substr($0, RSTART, RLENGTH), f, /[:,] */); print f[2], f[4] }' \
  "$tmp/ref.jsonl" >"$tmp/ref.txt"
awk 'match($0, /"step": [0-9]+, "loss": [^,]+,/) { split(substr($0, RSTART, RLENGTH), f, /[:,] */); print f[2], f[4] }' \
  "$tmp/crash.jsonl" >"$tmp/crash.txt"
mismatch=$(awk 'NR == FNR { ref[$1] = $2; next } !($1 in ref) || ref[$1] != $2 { n++ } END { print n + 0 }' "$tmp/ref.txt" "$tmp/crash.txt")
covered=$(cut -d' ' -f1 "$tmp/crash.txt" | sort -un | wc -l)
echo "$(wc -l <"$tmp/crash.txt") loss lines logged across the pieces ($((
  $(wc -l <"$tmp/crash.txt") - covered)) repeated after resumes)"
check "every logged loss equals the uninterrupted run's bit for bit" '[ "$mismatch" -eq 0 ]'
check "every step's loss was logged" '[ "$covered" -eq $steps ]'
echo "$pass passed, $fail failed"
