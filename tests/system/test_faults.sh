#!/usr/bin/env bash
# Fault handling of ./train (CPU backend): signals (SIGUSR1 saves and goes on, SIGINT/SIGTERM save
# and exit), non-finite losses and gradients (skipped, then a clear stop at
# reliability.max_bad_steps), loss spikes (logged), storage faults while checkpointing (file-size
# limit, a full tmpfs, a directory that is a file, an unwritable temp path: a clear error naming
# the path, and the previous checkpoint intact), and checkpoints of another model, batch or recipe
# (refused, naming the key). Uses the test hook TRAIN_INJECT_NAN_AT (see train.c).
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'umount "$tmp/full" 2>/dev/null; rm -rf "$tmp"' EXIT
C=(configs/tiny.yaml --set parallel.backend=cpu --set parallel.threads=2 --set logging.interval=1
   --set schedule.warmup_steps=2 --set eval.interval=0)


# ---- signals: SIGUSR1 saves and continues; SIGINT then saves and exits 0
./train "${C[@]}" --set schedule.total_steps=100000 --set checkpoint.dir="$tmp/sig" >"$tmp/sig.out" 2>&1 &
pid=$!
wait_for "$tmp/sig.out" '^step *3/'
kill -USR1 $pid
wait_for "$tmp/sig.out" 'received SIGUSR1'
wait_for "$tmp/sig.out" 'saved checkpoint'
saved=$(grep -m1 -o 'ckpt_[0-9]*\.bin' "$tmp/sig.out" | tr -dc 0-9 | sed 's/^0*//')
check "SIGUSR1 saves a checkpoint" '[ -n "$saved" ] && [ -f "$tmp/sig/$(printf "ckpt_%08d.bin" "$saved")" ]'
wait_until '[ "$(last_step "$tmp/sig.out")" -gt "${saved:-0}" ] || ! kill -0 $pid 2>/dev/null'
check "SIGUSR1 does not stop the run" 'kill -0 $pid 2>/dev/null && [ "$(last_step "$tmp/sig.out")" -gt "$saved" ]'
kill -INT $pid; wait $pid; rc=$?
check "SIGINT exits cleanly" '[ $rc -eq 0 ] && grep -q "received signal 2: saving and exiting" "$tmp/sig.out"'
final=$(last_step "$tmp/sig.out")
check "SIGINT saves the step it stopped at" '[ -f "$tmp/sig/$(printf "ckpt_%08d.bin" "$final")" ]'
out=$(./train "${C[@]}" --set schedule.total_steps=100000 --set checkpoint.dir="$tmp/sig" --max-steps $((final + 1)) --resume 2>&1)
check "the SIGINT checkpoint resumes" 'echo "$out" | grep -q "at step $final\$"'
./train "${C[@]}" --set schedule.total_steps=100000 --set checkpoint.dir="$tmp/term" >"$tmp/term.out" 2>&1 &
pid=$!
wait_for "$tmp/term.out" '^step *2/'
kill -TERM $pid; wait $pid; rc=$?
check "SIGTERM saves and exits cleanly" '[ $rc -eq 0 ] && grep -q "received signal 15" "$tmp/term.out" && ls "$tmp/term"/ckpt_*.bin >/dev/null 2>&1'

# ---- non-finite steps: skipped and logged; a run that recovers matches one without the fault
# except for the skipped steps; K in a row stop the run with the last checkpoint kept.
TRAIN_INJECT_NAN_AT=5,2 ./train "${C[@]}" --set schedule.total_steps=8 --set logging.file="$tmp/nan.jsonl" >"$tmp/nan.out" 2>&1; rc=$?
check "2 NaN losses are skipped and the run completes" '[ $rc -eq 0 ] && [ "$(grep -c "not finite, skipping" "$tmp/nan.out")" -eq 2 ]'
check "skipped steps are in the JSONL log" '[ "$(grep -c "\"event\": \"skipped\"" "$tmp/nan.jsonl")" -eq 2 ] && grep -q "\"step\": 6, \"event\": \"skipped\", \"loss\": \"nan\"" "$tmp/nan.jsonl"'
check "the losses before the fault are logged" 'grep -q "\"step\": 4, \"loss\"" "$tmp/nan.jsonl" && ! grep -q "\"step\": 5, \"loss\"" "$tmp/nan.jsonl"'
TRAIN_INJECT_NAN_AT=3,1,grad ./train "${C[@]}" --set schedule.total_steps=4 >"$tmp/grad.out" 2>&1; rc=$?
check "a NaN gradient is skipped (loss finite, norm nan)" '[ $rc -eq 0 ] && grep -Eq "step +3: loss [0-9.]+, grad norm nan: not finite" "$tmp/grad.out"'
TRAIN_INJECT_NAN_AT=5,100 ./train "${C[@]}" --set schedule.total_steps=20 --set checkpoint.dir="$tmp/nan" \
  --set checkpoint.interval=4 --set reliability.max_bad_steps=3 >"$tmp/stop.out" 2>&1; rc=$?
check "3 bad steps in a row stop the run (max_bad_steps 3)" '[ $rc -ne 0 ] && grep -q "3 consecutive non-finite steps (reliability.max_bad_steps), the last at step 7" "$tmp/stop.out"'
check "the stop names the last good checkpoint" 'grep -q "last good checkpoint, $tmp/nan/ckpt_00000004.bin" "$tmp/stop.out"'
out=$(./train "${C[@]}" --set schedule.total_steps=6 --set checkpoint.dir="$tmp/nan" --resume 2>&1); rc=$?
check "the run resumes from the kept checkpoint" '[ $rc -eq 0 ] && echo "$out" | grep -q "ckpt_00000004.bin at step 4"'
TRAIN_INJECT_NAN_AT=2,20 ./train "${C[@]}" --set schedule.total_steps=30 >"$tmp/def.out" 2>&1; rc=$?
check "the default max_bad_steps is 10" '[ $rc -ne 0 ] && grep -q "10 consecutive non-finite steps" "$tmp/def.out"'
out=$(TRAIN_INJECT_NAN_AT=x ./train "${C[@]}" 2>&1); rc=$?
check "a malformed TRAIN_INJECT_NAN_AT is refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "TRAIN_INJECT_NAN_AT: expected step"'

# ---- loss spikes: a warmup to a destructive lr (5) makes the loss jump from ~20 to ~70 at step 6,
# 3x the mean of the 5 steps before; factor 1.5 leaves a wide margin. Logged; the run goes on.
SP=("${C[@]}" --set schedule.total_steps=12 --set schedule.warmup_steps=12 --set schedule.type=constant
    --set optim.lr=5 --set reliability.spike_window=5)
./train "${SP[@]}" --set reliability.spike_factor=1.5 --set logging.file="$tmp/spike.jsonl" >"$tmp/spike.out" 2>&1; rc=$?
check "a loss spike is reported on stdout" '[ $rc -eq 0 ] && grep -Eq "step +6: loss spike [0-9.]+ > 1.5 x running mean [0-9.]+ of the last 5 steps" "$tmp/spike.out"'
check "no spike is reported before the window is full" '! grep -Eq "step +[1-5]: loss spike" "$tmp/spike.out"'
check "a loss spike is in the JSONL log" 'grep -q "\"step\": 6, \"event\": \"spike\", \"loss\": [0-9.e+]*, \"running_mean\"" "$tmp/spike.jsonl"'
./train "${SP[@]}" --set reliability.spike_factor=0 >"$tmp/nospike.out" 2>&1
check "spike_factor 0 turns the check off" '! grep -q "loss spike" "$tmp/nospike.out"'
./train "${C[@]}" --set schedule.total_steps=30 --set reliability.spike_window=5 >"$tmp/calm.out" 2>&1
check "a normal run reports no spike" '! grep -q "loss spike" "$tmp/calm.out"'
out=$(./train "${C[@]}" --set reliability.spike_factor=0.5 2>&1); rc=$?
check "spike_factor in (0, 1] is refused naming the key" '[ $rc -ne 0 ] && echo "$out" | grep -q "reliability.spike_factor: 0.5"'
out=$(./train "${C[@]}" --set reliability.max_bad_steps=0 2>&1); rc=$?
check "max_bad_steps 0 is refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "reliability.max_bad_steps"'

# ---- storage faults while checkpointing. Each case starts from a good checkpoint at step 4.
S=("${C[@]}" --set schedule.total_steps=8 --set checkpoint.interval=2)
good_ckpt() { ./train "${S[@]}" --set checkpoint.dir="$1" --max-steps 4 >/dev/null 2>&1; }
# True when dir $1's newest checkpoint is step 4 and a resume loads it.
intact() {
  local o; o=$(./train "${S[@]}" --set checkpoint.dir="$1" --max-steps 4 --resume 2>&1)
  echo "$o" | grep -q "ckpt_00000004.bin at step 4" && ! echo "$o" | grep -q "skipping invalid" && ! ls "$1"/*.tmp >/dev/null 2>&1
}
good_ckpt "$tmp/fsz"
out=$( (ulimit -f 1000; ./train "${S[@]}" --set checkpoint.dir="$tmp/fsz" --resume 2>&1) ); rc=$?
check "a file-size limit fails the save naming the temp file" '[ $rc -ne 0 ] && echo "$out" | grep -q "checkpoint at step 6 failed: cannot write checkpoint temp file .$tmp/fsz/ckpt_00000006.bin.tmp.: File too large"'
check "... and names the intact previous checkpoint" 'echo "$out" | grep -q "last good checkpoint is intact: $tmp/fsz/ckpt_00000004.bin"'
check "... which is still there and loads" 'intact "$tmp/fsz"'

mkdir -p "$tmp/full"
if mount -t tmpfs -o size=5m tmpfs "$tmp/full" 2>/dev/null; then  # a real ENOSPC: room for two 2 MB checkpoints
  good_ckpt "$tmp/full/ck"
  out=$(./train "${S[@]}" --set checkpoint.dir="$tmp/full/ck" --resume 2>&1); rc=$?
  check "a full disk fails the save naming the path" '[ $rc -ne 0 ] && echo "$out" | grep -q "$tmp/full/ck/ckpt_00000006.bin.tmp.: No space left on device"'
  check "... and the previous checkpoint stays loadable" 'intact "$tmp/full/ck"'
  umount "$tmp/full"
else
  echo "note: cannot mount a tmpfs here (not root?): the full-disk case is covered by the file-size limit only"
fi

touch "$tmp/afile"
out=$(./train "${S[@]}" --set checkpoint.dir="$tmp/afile" 2>&1); rc=$?
check "a checkpoint dir that is a file is refused before training" '[ $rc -ne 0 ] && echo "$out" | grep -q "checkpoint.dir: .*$tmp/afile. is not a directory" && ! echo "$out" | grep -q "^step"'
good_ckpt "$tmp/perm"
mkdir "$tmp/perm/ckpt_00000006.bin.tmp"  # the save's temp path cannot be opened for writing
out=$(./train "${S[@]}" --set checkpoint.dir="$tmp/perm" --resume 2>&1); rc=$?
check "an unwritable temp file fails the save naming it" '[ $rc -ne 0 ] && echo "$out" | grep -q "cannot create checkpoint temp file .$tmp/perm/ckpt_00000006.bin.tmp.: Is a directory"'
rmdir "$tmp/perm/ckpt_00000006.bin.tmp"
check "... and the previous checkpoint stays loadable" 'intact "$tmp/perm"'
if [ "$(id -u)" -ne 0 ]; then  # root ignores permissions
  good_ckpt "$tmp/ro"; chmod a-w "$tmp/ro"
  out=$(./train "${S[@]}" --set checkpoint.dir="$tmp/ro" --resume 2>&1); rc=$?
  check "a read-only checkpoint dir is refused naming it" '[ $rc -ne 0 ] && echo "$out" | grep -q "$tmp/ro. is not writable"'
  chmod u+w "$tmp/ro"
fi

# ---- checkpoints of another run are refused, naming the key
M=("${C[@]}" --set schedule.total_steps=4 --set checkpoint.dir="$tmp/mm")
./train "${M[@]}" --set precision.recipe=mxfp4 >/dev/null 2>&1
refused() { out=$(./train "${M[@]}" --set precision.recipe=mxfp4 --resume "$@" 2>&1); [ $? -ne 0 ] && echo "$out" | grep -q "does not match this run"; }
check "model mismatch names model.n_layers" 'refused --set model.n_layers=3 && echo "$out" | grep -q "model.n_layers: checkpoint has 2, this run has 3"'
check "batch mismatch names batch.global_batch" 'refused --set batch.global_batch=32 && echo "$out" | grep -q "batch.global_batch: checkpoint has 16, this run has 32"'
check "seq_len mismatch names batch.seq_len" 'refused --set batch.seq_len=32 && echo "$out" | grep -q "batch.seq_len: checkpoint has 64, this run has 32"'
check "seed mismatch names seed" 'refused --set seed=7 && echo "$out" | grep -q "seed: checkpoint has 42, this run has 7"'
check "recipe mismatch names precision.recipe" 'refused --set precision.recipe=nvfp4 && echo "$out" | grep -q "precision.recipe: checkpoint has mxfp4, this run has nvfp4"'
check "Hadamard mismatch names precision.hadamard" 'refused --set precision.hadamard=none && echo "$out" | grep -q "precision.hadamard: checkpoint has h32, this run has none"'
check "SR mismatch names precision.sr" 'refused --set precision.sr=dgrad_wgrad && echo "$out" | grep -q "precision.sr: checkpoint has dgrad, this run has dgrad_wgrad"'
check "BF16 block mismatch names precision.bf16_last_blocks" 'refused --set precision.bf16_last_blocks=1 && echo "$out" | grep -q "precision.bf16_last_blocks: checkpoint has 0, this run has 1"'
out=$(./train "${M[@]}" --set precision.recipe=mxfp4 --set precision.hadamard=h32 --set schedule.total_steps=5 --resume 2>&1); rc=$?
check "the same recipe spelled explicitly (h32 = auto) resumes" '[ $rc -eq 0 ] && echo "$out" | grep -q "at step 4"'
echo "$pass passed, $fail failed"
