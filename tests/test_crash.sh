#!/usr/bin/env bash
# Crash safety of ./train (CPU backend): a run is killed with SIGKILL at random moments, many times,
# and resumed with --resume after each kill until it completes. Checkpoints are written every 2
# steps and stretched with the test hook TRAIN_CKPT_SLOW_MS (model/checkpoint.h), so that about
# half the time is spent inside a save and many kills land in one. Asserts: every resume loads the
# newest complete checkpoint on disk (never a partial one: no "skipping invalid checkpoint"
# warning, and never an older one), some kills did interrupt a save, and every loss logged across
# all the pieces (a resumed run appends to the JSONL log, so steps after a checkpoint may appear
# twice) equals the uninterrupted run's bit for bit. CRASH_KILLS / CRASH_SECONDS bound the work.
cd "$(dirname "$0")/.." || exit 1
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
kills_wanted=${CRASH_KILLS:-30} budget=${CRASH_SECONDS:-60} steps=${CRASH_STEPS:-150}
# CRASH_BACKEND=cuda CRASH_ARGS="--set precision.recipe=mxfp4" CRASH_SLEEP_MS=1500 runs the same test on a
# GPU (scripts/gpu_check.sh crash): parallel.deterministic makes GPU runs bit-reproducible.
backend=${CRASH_BACKEND:-cpu} sleep_ms=${CRASH_SLEEP_MS:-100} span_ms=${CRASH_SPAN_MS:-500}
RANDOM=12345  # the kill times follow a fixed sequence; where they land still depends on the machine
C=(configs/tiny.yaml --set parallel.backend=$backend --set parallel.threads=2 --set logging.interval=1
   --set eval.interval=0 --set schedule.total_steps=$steps --set parallel.deterministic=true ${CRASH_ARGS:-})

./train "${C[@]}" --set logging.file="$tmp/ref.jsonl" >"$tmp/ref.out" 2>&1
check "the uninterrupted run succeeds" '[ $? -eq 0 ] && [ "$(grep -c "\"loss\"" "$tmp/ref.jsonl")" -eq $steps ]'

R=("${C[@]}" --set checkpoint.dir="$tmp/ck" --set checkpoint.interval=2 --set logging.file="$tmp/crash.jsonl" --resume)
newest() { ls "$tmp/ck"/ckpt_*.bin 2>/dev/null | sort | tail -n 1; }  # 8-digit steps: sorted by name
kills=0 in_save=0 bad_resume=0 invalid=0 runs=0 finished=0 t0=$SECONDS
while [ $kills -lt "$kills_wanted" ] && [ $((SECONDS - t0)) -lt "$budget" ]; do
  want=$(newest)
  runs=$((runs + 1))
  TRAIN_CKPT_SLOW_MS=60 ./train "${R[@]}" >"$tmp/run$runs.out" 2>&1 &
  pid=$!
  ms=$((sleep_ms + RANDOM % span_ms))  # 0.1 .. 0.6 s on the CPU, startup included
  sleep "$((ms / 1000)).$(printf %03d $((ms % 1000)))"
  if kill -KILL $pid 2>/dev/null; then
    wait $pid 2>/dev/null
    kills=$((kills + 1))
    ls "$tmp/ck"/*.tmp >/dev/null 2>&1 && in_save=$((in_save + 1))  # killed inside a save
  else
    wait $pid; finished=1
  fi
  # What this run resumed from must be the newest complete checkpoint before it started.
  if [ -z "$want" ]; then
    grep -q "resumed from" "$tmp/run$runs.out" && bad_resume=$((bad_resume + 1))
  elif grep -q "resumed from" "$tmp/run$runs.out"; then
    grep -q "resumed from $want at step" "$tmp/run$runs.out" || { bad_resume=$((bad_resume + 1)); echo "run $runs: expected $want"; grep "resumed" "$tmp/run$runs.out"; }
  fi
  grep -q "skipping invalid checkpoint" "$tmp/run$runs.out" && invalid=$((invalid + 1))
  [ $finished -eq 1 ] && break
done
echo "$kills kills in $runs runs ($in_save inside a checkpoint save), $((SECONDS - t0)) s"
want=$(newest)
./train "${R[@]}" >"$tmp/final.out" 2>&1; rc=$?
check "the run completes after the kills" '[ $rc -eq 0 ] && [ -f "$tmp/ck/$(printf "ckpt_%08d.bin" $steps)" ]'
check "the final resume loads the newest checkpoint" '[ -n "$want" ] && grep -q "resumed from $want at step" "$tmp/final.out"'
check "at least 20 kills (or the time bound)" '[ $kills -ge 20 ] || [ $kills -ge "$kills_wanted" ]'
check "some kills landed inside a checkpoint save" '[ $in_save -ge 1 ]'
check "every resume loaded the newest complete checkpoint" '[ $bad_resume -eq 0 ]'
check "no invalid checkpoint was ever found" '[ $invalid -eq 0 ] && ! grep -q "skipping invalid" "$tmp/final.out"'
check "no temp file is left after the final save" '! ls "$tmp/ck"/*.tmp >/dev/null 2>&1'

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
