#!/usr/bin/env bash
# Data parallelism on the CPU (TCP transport, ZeRO-1), several processes on this machine:
# 2 ranks match 1 rank at the same global batch; a sharded checkpoint resumes bit-exactly; a
# checkpoint re-shards from 2 ranks to 1 and from 1 to 2; a dead or hung rank stops the other with a
# clear error within parallel.timeout_s; a world size that the config does not expect is refused.
# The gradient reduction overlapping the backward (parallel.overlap_reduce, parallel.bucket_mb)
# gives the same bits as the reduction after it, in fp32 and with parallel.grad_reduce=bf16.
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# global batch 16 = micro 4 x accum 2 x 2 ranks = micro 4 x accum 4 x 1 rank; one thread per rank
base=(--set batch.micro_batch=4 --set batch.global_batch=16 --set schedule.total_steps=30 --set schedule.warmup_steps=5
      --set parallel.threads=1 --set parallel.backend=cpu --set logging.interval=1 --set eval.interval=0
      --set parallel.timeout_s=5)
launch() { LOG_DIR="$1" scripts/runs/launch_local.sh "${@:2}" >/dev/null 2>&1; }
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1"; }
# max |a - b| over the steps both JSONL logs have losses for (the later line of a step wins)
maxdiff() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def read(p):
    d = {}
    for line in open(p):
        j = json.loads(line)
        if "loss" in j and "event" not in j: d[j["step"]] = j["loss"]
    return d
a, b = read(sys.argv[1]), read(sys.argv[2])
print(max(abs(a[s] - b[s]) for s in a if s in b))
PY
}

# 1. Same global batch: 2 ranks vs 1. The gradients differ only in the order of the fp32 sums
# (each rank sums its 2 micro-batches, then rank 0 adds the ranks, instead of 4 in a row): relative
# ~1e-7 per step, which AdamW's normalization can amplify for near-zero second moments. Over 30
# steps the losses (about 6 -> 4.5) measured agree to ~1e-6; 1e-3 is a loose, still meaningful bound.
launch "$tmp/l2" 2 configs/tiny.yaml "${base[@]}" --set logging.file="$tmp/w2.jsonl"; rc=$?
check "2-rank run succeeds" '[ $rc -eq 0 ] && [ "$(losses "$tmp/w2.jsonl" | wc -l)" -eq 30 ]'
./train configs/tiny.yaml "${base[@]}" --set parallel.threads=2 --set logging.file="$tmp/w1.jsonl" >"$tmp/w1.out" 2>&1
d=$(maxdiff "$tmp/w1.jsonl" "$tmp/w2.jsonl"); echo "2 ranks vs 1 rank, same global batch: max |loss diff| over 30 steps = $d"
check "2 ranks and 1 rank give the same losses within 1e-3 (got $d)" 'python3 -c "import sys; sys.exit(not $d < 1e-3)"'
last=$(losses "$tmp/w2.jsonl" | tail -n 1 | grep -o "[0-9.]*$")
check "the 2-rank run learns: loss at step 30 below 5.5 (got $last, from about 6.2)" 'python3 -c "import sys; sys.exit(not $last < 5.5)"'

# 2. Sharded checkpoint: stop at 15, resume on 2 ranks, bit-identical to the uninterrupted run.
ck=(--set checkpoint.dir="$tmp/ck2" --set checkpoint.interval=5)
launch "$tmp/l3" 2 configs/tiny.yaml "${base[@]}" "${ck[@]}" --set logging.file="$tmp/r2.jsonl" --max-steps 15
check "a sharded checkpoint has one file per rank and a manifest" \
  '[ -f "$tmp/ck2/rank_0/ckpt_00000015.bin" ] && [ -f "$tmp/ck2/rank_1/ckpt_00000015.bin" ] && grep -q "^world 2$" "$tmp/ck2/manifest_00000015.txt"'
check "the manifest names both shard files with checksums" '[ "$(grep -c "^shard [01] rank_[01]/ckpt_00000015.bin [0-9]* [0-9]* [0-9]* [0-9a-f]\{16\}$" "$tmp/ck2/manifest_00000015.txt")" -eq 2 ]'
cp -r "$tmp/ck2" "$tmp/ck2_at15"
# The same 15 steps saved synchronously: the same rank files and manifest (the checksums hashed as the
# files are written), and the manifest verifies against the files when a resume reads it back.
launch "$tmp/l3s" 2 configs/tiny.yaml "${base[@]}" --set checkpoint.dir="$tmp/ck2s" --set checkpoint.interval=5 \
  --set checkpoint.async=false --max-steps 15
check "a synchronous sharded save writes the same files and manifest as the background one" \
  'cmp -s "$tmp/ck2s/manifest_00000015.txt" "$tmp/ck2_at15/manifest_00000015.txt" && cmp -s "$tmp/ck2s/rank_0/ckpt_00000015.bin" "$tmp/ck2_at15/rank_0/ckpt_00000015.bin" && cmp -s "$tmp/ck2s/rank_1/ckpt_00000015.bin" "$tmp/ck2_at15/rank_1/ckpt_00000015.bin"'
launch "$tmp/l3r" 2 configs/tiny.yaml "${base[@]}" --set checkpoint.dir="$tmp/ck2s" --resume --max-steps 16
check "... and a resume verifies it" 'grep -q "resumed from .*manifest_00000015.txt at step 15" "$tmp/l3r/rank_0.log"'
launch "$tmp/l4" 2 configs/tiny.yaml "${base[@]}" "${ck[@]}" --set logging.file="$tmp/r2.jsonl" --resume
check "2-rank resume reports step 15" 'grep -q "resumed from .*manifest_00000015.txt at step 15" "$tmp/l4/rank_0.log"'
check "2-rank resumed losses are bit-identical to the uninterrupted 2-rank run" 'diff <(losses "$tmp/w2.jsonl") <(losses "$tmp/r2.jsonl")'

# 3. Re-sharding: the step-15 checkpoint of 2 ranks continues on 1 rank ...
./train configs/tiny.yaml "${base[@]}" --set parallel.threads=2 --set checkpoint.dir="$tmp/ck2_at15" \
  --set logging.file="$tmp/r21.jsonl" --resume >"$tmp/r21.out" 2>&1; rc=$?
check "2 -> 1 resume re-shards and finishes" '[ $rc -eq 0 ] && grep -q "re-sharding the optimizer state from 2 to 1 ranks" "$tmp/r21.out" && grep -q "step     30/30" "$tmp/r21.out"'
d=$(maxdiff "$tmp/w1.jsonl" "$tmp/r21.jsonl"); echo "2 -> 1 re-sharded resume vs 1-rank run: max |loss diff| = $d"
check "2 -> 1 losses stay within 1e-3 of the uninterrupted run (got $d)" 'python3 -c "import sys; sys.exit(not $d < 1e-3)"'
# ... and a one-process checkpoint (the old single-file format) continues on 2 ranks.
./train configs/tiny.yaml "${base[@]}" --set parallel.threads=2 --set checkpoint.dir="$tmp/ck1" \
  --set logging.file="$tmp/r12.jsonl" --max-steps 15 >/dev/null 2>&1
launch "$tmp/l5" 2 configs/tiny.yaml "${base[@]}" --set checkpoint.dir="$tmp/ck1" --set logging.file="$tmp/r12.jsonl" --resume; rc=$?
check "1 -> 2 resume re-shards and finishes" '[ $rc -eq 0 ] && grep -q "re-sharding the optimizer state from 1 to 2 ranks" "$tmp/l5/rank_0.log" && [ -f "$tmp/ck1/manifest_00000030.txt" ]'
d=$(maxdiff "$tmp/w1.jsonl" "$tmp/r12.jsonl"); echo "1 -> 2 re-sharded resume vs 1-rank run: max |loss diff| = $d"
check "1 -> 2 losses stay within 1e-3 of the uninterrupted run (got $d)" 'python3 -c "import sys; sys.exit(not $d < 1e-3)"'

# 4. File rendezvous (no MASTER_PORT): rank 0 publishes its port in a file; same losses as over env.
for r in 0 1; do
  env -u MASTER_PORT RANK=$r WORLD_SIZE=2 ./train configs/tiny.yaml "${base[@]}" --set parallel.data_parallel=2 \
    --set schedule.total_steps=30 --set parallel.rendezvous="file:$tmp/rdv" --set logging.file="$tmp/f$r.jsonl" \
    >"$tmp/f$r.out" 2>&1 &
done
wait
check "file rendezvous gives the same losses as env rendezvous" 'diff <(losses "$tmp/w2.jsonl") <(losses "$tmp/f0.jsonl")'

# 5. Failures stop the job within the timeout, naming the rank.
long=(configs/tiny.yaml "${base[@]}" --set schedule.total_steps=100000 --set parallel.data_parallel=2 --set parallel.timeout_s=3)
port=$((30000 + RANDOM % 20000))
start_pair() {
  for r in 0 1; do MASTER_PORT=$port RANK=$r WORLD_SIZE=2 ./train "${long[@]}" >"$tmp/$1$r.out" 2>&1 & eval "pid$r=\$!"; done
  wait_for "$tmp/${1}0.out" "step .*loss"
}
start_pair kill
{ kill -KILL "$pid1"; t0=$SECONDS; wait "$pid0"; rc=$?; wait "$pid1"; } 2>/dev/null  # quiet bash's "Killed"
check "killing rank 1 stops rank 0 with an error naming rank 1" '[ $rc -ne 0 ] && grep -q "rank 0: rank 1 closed the connection\|rank 0: lost the connection to rank 1" "$tmp/kill0.out"'
# The bounds below are the 3 s timeout plus room for a loaded machine: what they catch is a rank
# that waits for the default timeout (600 s) or forever.
check "... within the timeout ($((SECONDS - t0)) s)" '[ $((SECONDS - t0)) -le 10 ]'
port=$((port + 1)); start_pair hang
{ kill -STOP "$pid1"; t0=$SECONDS; wait "$pid0"; rc=$?; kill -KILL "$pid1"; wait "$pid1"; } 2>/dev/null
check "a hung rank 1 stops rank 0 after parallel.timeout_s, naming rank 1" '[ $rc -ne 0 ] && grep -q "rank 0: no progress from rank 1 for 3 s" "$tmp/hang0.out"'
# At least 2 whole seconds of $SECONDS: the 3 s count from rank 1's last progress, a step before
# the stop, and $SECONDS has 1 s steps.
check "... after the timeout, not before, and within it plus a step ($((SECONDS - t0)) s)" \
  '[ $((SECONDS - t0)) -ge 2 ] && [ $((SECONDS - t0)) -le 12 ]'
out=$(RANK=1 WORLD_SIZE=2 MASTER_PORT=$((port + 1)) ./train "${long[@]}" --set parallel.timeout_s=1 2>&1); rc=$?
check "a rank whose rank 0 never comes up stops after parallel.timeout_s" '[ $rc -ne 0 ] && echo "$out" | grep -q "rank 1: could not reach rank 0 at 127.0.0.1 within 1 s"'
out=$(RANK=0 WORLD_SIZE=2 MASTER_PORT=$((port + 2)) ./train "${long[@]}" --set parallel.timeout_s=1 2>&1); rc=$?
check "rank 0 alone stops after parallel.timeout_s" '[ $rc -ne 0 ] && echo "$out" | grep -q "rank 0: not every rank connected within 1 s"'
out=$(LOG_DIR="$tmp/l6" scripts/runs/launch_local.sh 2 configs/tiny.yaml "${base[@]}" --set parallel.rendezvous=bogus 2>&1); rc=$?
check "launch_local.sh propagates a rank's failure" '[ $rc -ne 0 ] && echo "$out" | grep -q "launch_local: rank [01] exited with status"'

# 6. The world size must be the one the config planned the global batch for.
out=$(RANK=0 WORLD_SIZE=2 ./train configs/tiny.yaml "${base[@]}" 2>&1); rc=$?
check "WORLD_SIZE=2 with parallel.data_parallel=1 is refused naming both" '[ $rc -ne 0 ] && echo "$out" | grep -q "parallel.data_parallel is 1 but the launcher started 2 processes"'
out=$(./train configs/tiny.yaml "${base[@]}" --set parallel.data_parallel=2 2>&1); rc=$?
check "parallel.data_parallel=2 in one process is refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "parallel.data_parallel is 2 but the launcher started 1 process"'
out=$(RANK=2 WORLD_SIZE=2 ./train configs/tiny.yaml 2>&1); rc=$?
check "RANK >= WORLD_SIZE is refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "RANK=2 is not below WORLD_SIZE=2"'
# 7. Overlapped reduction (the default: buckets handed over by the backward's gradient hook) against
# the reduction after the backward: every element is the same rank-order sum, so the same bits;
# with 3 ranks the slices straddle shard boundaries. bucket_mb=0: one reduction per slice.
check "the banner names the transport and the overlapped fp32 reduction" \
  'grep -q "data parallel: 2 ranks over TCP, ZeRO-1 .* gradients reduced in fp32, overlapping the last backward" "$tmp/l2/rank_0.log"'
launch "$tmp/o1" 2 configs/tiny.yaml "${base[@]}" --set parallel.overlap_reduce=false --set logging.file="$tmp/o1.jsonl"
check "overlap_reduce=false gives the overlapped run's losses bit for bit" 'diff <(losses "$tmp/w2.jsonl") <(losses "$tmp/o1.jsonl")'
launch "$tmp/o2" 2 configs/tiny.yaml "${base[@]}" --set parallel.bucket_mb=0 --set logging.file="$tmp/o2.jsonl"
check "bucket_mb=0 (a reduction per slice) gives the same bits" 'diff <(losses "$tmp/w2.jsonl") <(losses "$tmp/o2.jsonl")'
b3=(--set batch.micro_batch=2 --set batch.global_batch=12 --set schedule.total_steps=10)
launch "$tmp/o3" 3 configs/tiny.yaml "${base[@]}" "${b3[@]}" --set parallel.bucket_mb=0.02 --set logging.file="$tmp/o3.jsonl"; rc=$?
launch "$tmp/o4" 3 configs/tiny.yaml "${base[@]}" "${b3[@]}" --set parallel.overlap_reduce=false --set logging.file="$tmp/o4.jsonl"
check "3 ranks, 80 KB buckets across shard boundaries: same bits as after the backward" \
  '[ $rc -eq 0 ] && [ "$(losses "$tmp/o3.jsonl" | wc -l)" -eq 10 ] && diff <(losses "$tmp/o3.jsonl") <(losses "$tmp/o4.jsonl")'
# The overlapped reduction moves only the embedding rows some rank's tokens touched (zero.h,
# zero_note_tokens); with a 16K vocabulary most rows are untouched by 2 x 96 tokens a rank and step.
bv=(--set model.vocab_size=16384 --set batch.micro_batch=3 --set batch.global_batch=12 --set batch.seq_len=32 --set schedule.total_steps=10)
launch "$tmp/o5" 2 configs/tiny.yaml "${base[@]}" "${bv[@]}" --set logging.file="$tmp/o5.jsonl"; rc=$?
launch "$tmp/o6" 2 configs/tiny.yaml "${base[@]}" "${bv[@]}" --set parallel.overlap_reduce=false --set logging.file="$tmp/o6.jsonl"
check "16K vocabulary: the touched-rows embedding reduction gives the whole-table reduction's bits" \
  '[ $rc -eq 0 ] && [ "$(losses "$tmp/o5.jsonl" | wc -l)" -eq 10 ] && diff <(losses "$tmp/o5.jsonl") <(losses "$tmp/o6.jsonl")'

# 8. BF16 on the wire: overlapped and not give the same bits; close to fp32 but not identical.
launch "$tmp/h1" 2 configs/tiny.yaml "${base[@]}" --set parallel.grad_reduce=bf16 --set parallel.bucket_mb=0 \
  --set logging.file="$tmp/h1.jsonl"; rc=$?
launch "$tmp/h2" 2 configs/tiny.yaml "${base[@]}" --set parallel.grad_reduce=bf16 --set parallel.overlap_reduce=false \
  --set logging.file="$tmp/h2.jsonl"
check "grad_reduce=bf16 runs 30 steps and says so" '[ $rc -eq 0 ] && [ "$(losses "$tmp/h1.jsonl" | wc -l)" -eq 30 ] && grep -q "gradients reduced in bf16" "$tmp/h1/rank_0.log"'
check "bf16 overlapped and after the backward: same bits" 'diff <(losses "$tmp/h1.jsonl") <(losses "$tmp/h2.jsonl")'
d=$(maxdiff "$tmp/w2.jsonl" "$tmp/h1.jsonl"); echo "bf16 vs fp32 gradient reduction, 2 ranks: max |loss diff| over 30 steps = $d"
check "bf16 reduction stays within 1e-2 of fp32 and differs from it (got $d)" 'python3 -c "import sys; sys.exit(not 0 < $d < 1e-2)"'
out=$(./train configs/tiny.yaml --set parallel.grad_reduce=fp16 2>&1); rc=$?
check "an unknown parallel.grad_reduce is refused naming the key" '[ $rc -ne 0 ] && echo "$out" | grep -q "parallel.grad_reduce: invalid value .fp16."'

# 9. A non-finite gradient on every rank (injected after the reduction) skips the step on both.
TRAIN_INJECT_NAN_AT=5,1,grad launch "$tmp/nan" 2 configs/tiny.yaml "${base[@]}" --set schedule.total_steps=8 \
  --set logging.file="$tmp/nan.jsonl"; rc=$?
check "an injected NaN gradient skips step 5 on both ranks and the run goes on" \
  '[ $rc -eq 0 ] && grep -q "step      5: .*not finite, skipping" "$tmp/nan/rank_0.log" && grep -q "step      5: .*not finite, skipping" "$tmp/nan/rank_1.log" && grep -q "\"step\": 8, \"loss\"" "$tmp/nan.jsonl"'

# 10. launch_local.sh with KEEP_GOING=1 leaves the survivors to notice a SIGKILLed rank themselves.
KEEP_GOING=1 LOG_DIR="$tmp/kg" scripts/runs/launch_local.sh 2 "${long[@]}" >/dev/null 2>&1 & lpid=$!
wait_for "$tmp/kg/rank_0.log" "step .*loss"; wait_until '[ -s "$tmp/kg/rank_1.pid" ]'
{ kill -KILL "$(cat "$tmp/kg/rank_1.pid")"; t0=$SECONDS; wait "$lpid"; rc=$?; } 2>/dev/null
check "KEEP_GOING: the launcher reports both exits, rank 0 names the dead rank 1 ($((SECONDS - t0)) s)" \
  '[ $rc -ne 0 ] && [ "$(cat "$tmp/kg/rank_1.status")" = 137 ] && [ "$(cat "$tmp/kg/rank_0.status")" != 0 ] && grep -q "rank 1" "$tmp/kg/rank_0.log" && [ $((SECONDS - t0)) -le 10 ]'
# 7. A sharded save prunes the older rank files only once the new step's manifest exists: a run
# stopped at step 5, resumed with keep 1 and rank 1's next write held (TRAIN_CKPT_PAUSE) while rank 0's
# is done, then killed: manifest 5 and both its rank files are still there, and a resume takes them.
kp=(configs/tiny.yaml "${base[@]}" --set parallel.data_parallel=2 --set parallel.timeout_s=60 --set checkpoint.dir="$tmp/ck7"
    --set checkpoint.interval=5 --set checkpoint.keep=1 --set logging.file="$tmp/k7.jsonl")
launch "$tmp/l7" 2 "${kp[@]}" --max-steps 5
port=$((port + 10))
for r in 0 1; do
  hold=(); [ $r = 1 ] && hold=(env TRAIN_CKPT_PAUSE="$tmp/go7")
  "${hold[@]}" env MASTER_PORT=$port RANK=$r WORLD_SIZE=2 ./train "${kp[@]}" --resume >"$tmp/k7_$r.out" 2>&1 &
  eval "kp$r=\$!"
done
wait_for "$tmp/k7_1.out" "checkpoint write paused"
wait_until '[ -f "$tmp/ck7/rank_0/ckpt_00000010.bin" ] && [ "$(last_step "$tmp/k7_0.out")" -ge 12 ]'
{ kill -KILL "$kp0" "$kp1"; wait "$kp0"; wait "$kp1"; } 2>/dev/null
check "killed before manifest 10: manifest 5 and both its rank files remain" \
  '[ ! -f "$tmp/ck7/manifest_00000010.txt" ] && [ -f "$tmp/ck7/manifest_00000005.txt" ] &&
   [ -f "$tmp/ck7/rank_0/ckpt_00000005.bin" ] && [ -f "$tmp/ck7/rank_1/ckpt_00000005.bin" ]'
touch "$tmp/go7"
launch "$tmp/l8" 2 "${kp[@]}" --resume --max-steps 12
check "... and the resume takes step 5" 'grep -q "resumed from .*manifest_00000005.txt at step 5" "$tmp/l8/rank_0.log"'
check "... then keep 1 leaves one step's files per rank" \
  '[ "$(ls "$tmp/ck7/rank_0" | grep -c "^ckpt_.*\.bin$")" -eq 1 ] && [ "$(ls "$tmp/ck7/rank_1" | grep -c "^ckpt_.*\.bin$")" -eq 1 ] && [ "$(ls "$tmp/ck7" | grep -c "^manifest_")" -eq 1 ]'
echo "$pass passed, $fail failed"
