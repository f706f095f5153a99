#!/usr/bin/env bash
# Crash safety of ./train (CPU backend): a run is killed with SIGKILL many times and resumed with
# --resume after each kill until it completes. Checkpoints are written every 2 steps and stretched
# with the test hook TRAIN_CKPT_SLOW_MS (run/checkpoint.h). The kills wait for events, not times
# (a loaded machine changes nothing): every other run is killed while one of its saves is in
# progress (its temp file is there), the others once they log a step 1-6 steps past a checkpoint
# they completed. Asserts: every resume loads the newest complete checkpoint on disk (never a partial
# one: no "skipping invalid checkpoint" warning, and never an older one), the kills timed to a save
# did interrupt one, and every loss logged across all the pieces (a resumed run appends to the
# JSONL log, so steps after a checkpoint may appear twice) equals the uninterrupted run's bit for
# bit. CRASH_KILLS (30) and CRASH_STEPS (150) size the work. Saves are asynchronous (checkpoint.async,
# the default), so those kills land in background writes while training goes on. Then the same at
# chosen moments, with the test hook TRAIN_CKPT_PAUSE holding a write half-way: a SIGKILL leaves a
# partial temp file, the resume takes the previous checkpoint and the next save removes the file; a
# second save waits for the held one; SIGTERM waits for it and saves; the losses of all those pieces
# equal the uninterrupted run's bit for bit, and checkpoint.async=false writes the same bytes.
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
# A save of this run in progress: a temp file of a step after the one it resumed from, written since
# the run began ($tmp/began; a killed run's temp file of such a step can still be there from before).
saving_after() {
  local f; for f in "$tmp/ck"/ckpt_[0-9]*.bin.tmp; do
    [ -e "$f" ] && [ "$(step_of "$f")" -gt "$1" ] && [ "$f" -nt "$tmp/began" ] && return 0
  done; return 1
}
# Each run is killed at an event, not after a time, so that a loaded machine changes nothing:
# odd runs while a save of theirs is in progress, even runs once they log a step 1-6 steps past
# their checkpoint (inside a step or a save, wherever the kill lands).
kills=0 in_save=0 bad_resume=0 invalid=0 runs=0 finished=0 t0=$SECONDS
while [ $kills -lt "$kills_wanted" ]; do
  want=$(newest); base=0; [ -n "$want" ] && base=$(step_of "$want")
  runs=$((runs + 1)); out="$tmp/run$runs.out"; touch "$tmp/began"
  TRAIN_CKPT_SLOW_MS=60 ./train "${R[@]}" >"$out" 2>&1 &
  pid=$!
  if [ $((runs % 2)) -eq 1 ]; then wait_until "saving_after $base || ! kill -0 $pid 2>/dev/null"
  else  # once a save of this run is complete (on a GPU the steps outrun the saves), 1-6 steps past it
    wait_until "[ \$(step_of \$(newest)) -gt $base ] || ! kill -0 $pid 2>/dev/null"
    target=$(($(step_of "$(newest)") + 1 + RANDOM % 6))
    wait_until "[ \$(last_step $out) -ge $target ] || ! kill -0 $pid 2>/dev/null"
  fi
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

# ---- checkpoint.async (the default) at chosen moments, with the test hook TRAIN_CKPT_PAUSE=FILE: a
# write holds after the first section of its temp file until FILE exists (a line on stderr says so).
A=("${C[@]}" --set checkpoint.dir="$tmp/ak" --set checkpoint.interval=4 --set logging.file="$tmp/async.jsonl")
t1=$SECONDS
./train "${C[@]}" --set checkpoint.dir="$tmp/sk" --set checkpoint.interval=4 --set checkpoint.async=false \
  --max-steps 4 >"$tmp/sync.out" 2>&1
./train "${A[@]}" --max-steps 4 >"$tmp/a0.out" 2>&1; rc=$?
check "an async save reports its stall and its background write" \
  '[ $rc -eq 0 ] && grep -q "^saved checkpoint $tmp/ak/ckpt_00000004.bin (stall [0-9.]*s, background write [0-9.]*s)$" "$tmp/a0.out"'
check "checkpoint.async=false writes the same bytes, synchronously" \
  'cmp -s "$tmp/sk/ckpt_00000004.bin" "$tmp/ak/ckpt_00000004.bin" && grep -q "^saved checkpoint $tmp/sk/ckpt_00000004.bin ([0-9.]*s)$" "$tmp/sync.out" && ! grep -q "background" "$tmp/sync.out"'
# SIGKILL while the step-8 write is held: training went on past step 8 meanwhile; a partial temp file
# stays, the resume takes step 4, and its own save removes the temp file.
TRAIN_CKPT_PAUSE="$tmp/go1" ./train "${A[@]}" --resume >"$tmp/a1.out" 2>"$tmp/a1.err" &
pid=$!
wait_for "$tmp/a1.err" "paused in '$tmp/ak/ckpt_00000008.bin.tmp'"
wait_until "[ \$(last_step $tmp/a1.out) -ge 9 ] || ! kill -0 $pid 2>/dev/null"
trained=$(last_step "$tmp/a1.out")
kill -KILL $pid; wait $pid 2>/dev/null
check "training went on while the step-8 write was held (step $trained)" '[ "$trained" -ge 9 ]'
part=$(stat -c %s "$tmp/ak/ckpt_00000008.bin.tmp" 2>/dev/null || echo 0)
check "the kill left a partial temp file ($part bytes) and no step-8 checkpoint" \
  '[ "$part" -gt 0 ] && [ "$part" -lt "$(stat -c %s "$tmp/ak/ckpt_00000004.bin")" ] && [ ! -e "$tmp/ak/ckpt_00000008.bin" ]'
./train "${A[@]}" --resume --max-steps 12 >"$tmp/a2.out" 2>&1; rc=$?
check "the resume loads step 4, the newest complete checkpoint" \
  '[ $rc -eq 0 ] && grep -q "resumed from $tmp/ak/ckpt_00000004.bin at step 4$" "$tmp/a2.out" && ! grep -q "skipping invalid" "$tmp/a2.out"'
check "its saves removed the stale temp file" '[ -f "$tmp/ak/ckpt_00000012.bin" ] && ! ls "$tmp/ak"/*.tmp >/dev/null 2>&1'
# Two saves never overlap: with the step-13 write held (interval 1), the step-14 save waits for it
# before it copies anything.
TRAIN_CKPT_PAUSE="$tmp/go2" ./train "${A[@]}" --set checkpoint.interval=1 --resume --max-steps 16 \
  >"$tmp/a3.out" 2>"$tmp/a3.err" &
pid=$!
wait_for "$tmp/a3.out" "waiting for the background write of step 13"
check "while the step-13 write is held, the step-14 save waits and has copied nothing" \
  '! grep -q "checkpoint at step 14" "$tmp/a3.out" && [ ! -e "$tmp/ak/ckpt_00000014.bin.tmp" ] && [ "$(last_step "$tmp/a3.out")" -eq 14 ]'
touch "$tmp/go2"; wait $pid; rc=$?
order=$(grep -o "^checkpoint at step [0-9]*\|^saved checkpoint [^ ]*" "$tmp/a3.out" | sed 's/.*ckpt_0*\([0-9]*\).bin/S \1/; s/^checkpoint at step /C /' | tr '\n' ' ')
check "then every save ends before the next begins ($order)" '[ $rc -eq 0 ] && [ "$order" = "C 13 S 13 C 14 S 14 C 15 S 15 C 16 S 16 " ]'
# SIGTERM while the step-20 write is held: the run waits for it, saves the step it stops at, exits 0.
TRAIN_CKPT_PAUSE="$tmp/go3" ./train "${A[@]}" --resume >"$tmp/a4.out" 2>"$tmp/a4.err" &
pid=$!
wait_for "$tmp/a4.err" "paused in '$tmp/ak/ckpt_00000020.bin.tmp'"
kill -TERM $pid
wait_for "$tmp/a4.out" "waiting for the background write of step 20"
touch "$tmp/go3"; wait $pid; rc=$?
stop=$(last_step "$tmp/a4.out")
check "SIGTERM during a held write exits 0 after finishing it and saving step $stop" \
  '[ $rc -eq 0 ] && grep -q "^saved checkpoint $tmp/ak/ckpt_00000020.bin " "$tmp/a4.out" && grep -q "^saved checkpoint $tmp/ak/$(printf "ckpt_%08d.bin" "$stop") " "$tmp/a4.out" && ! ls "$tmp/ak"/*.tmp >/dev/null 2>&1'
./train "${A[@]}" --resume --max-steps $((stop + 4)) >"$tmp/a5.out" 2>&1; rc=$?
check "... and that checkpoint loads" '[ $rc -eq 0 ] && grep -q "resumed from $tmp/ak/$(printf "ckpt_%08d.bin" "$stop") at step $stop$" "$tmp/a5.out"'
awk 'match($0, /"step": [0-9]+, "loss": [^,]+,/) { split(substr($0, RSTART, RLENGTH), f, /[:,] */); print f[2], f[4] }' \
  "$tmp/async.jsonl" >"$tmp/async.txt"
mismatch=$(awk 'NR == FNR { ref[$1] = $2; next } !($1 in ref) || ref[$1] != $2 { n++ } END { print n + 0 }' "$tmp/ref.txt" "$tmp/async.txt")
covered=$(cut -d' ' -f1 "$tmp/async.txt" | sort -un | wc -l)
echo "7 runs at chosen moments of asynchronous saves, $((SECONDS - t1)) s"
check "every loss of the async pieces equals the uninterrupted run's bit for bit ($covered steps)" \
  '[ "$mismatch" -eq 0 ] && [ "$covered" -eq $((stop + 4)) ]'
echo "$pass passed, $fail failed"
