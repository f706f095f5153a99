#!/usr/bin/env bash
# scripts/gpu/gpu_multi.sh: data parallelism on one 2-GPU node (issue #6), in one call of at most
# BUDGET seconds (default 415, under 7 minutes). No internet needed: novels shards in .deps/novels.
#   bash scripts/gpu/gpu_multi.sh [build] [a] [b] [c] [d] [e] [h]      (default: all of them, in order)
# Steps, each ending with one "== ..." summary line (all collected again at the end):
#   build  make ./train (a no-op when it is up to date)
#   a      loss curves, small model on novels, 30 steps, global batch 32: 1 GPU vs 2 GPUs (fp32
#          gradient reduction, overlapped), 2 GPUs with the reduction after the backward (must be
#          bit-identical to the overlapped one), 2 GPUs with parallel.grad_reduce=bf16, 2 GPUs with
#          parallel.shard_master=false (fp32 masters whole: must be bit-identical to the sharded default)
#   b      resume: the 2-GPU run's step-15 checkpoint resumed on 2 GPUs (bit-exact steps 16-30) and
#          on 1 GPU (2 -> 1 re-sharding; continues within tolerance of the 1-GPU run)
#   c      SIGKILL rank 1 mid-run: rank 0 must exit non-zero naming it within timeout_s + 20 s
#   d      scaling: Llama-3 8B shapes with 4 layers, seq 8192, micro-batch 1, accumulation 1 and 8,
#          on 1 GPU and on 2 GPUs: tok/s/GPU and efficiency = tok/s/GPU(2) / tok/s/GPU(1); also
#          accumulation 1 with the BF16 gradient reduction
#   e      the full 32-layer Llama-3 8B at seq 8192 on 2 GPUs, 6 steps each with bf16 and mxfp4:
#          tok/s/GPU, BF16-equivalent MFU, peak memory per GPU, losses
#   h      SIGSTOP rank 1 (a hang, not a death): rank 0 must stop after parallel.timeout_s (15 s)
# Logs go to $OUT/gpu_multi_logs.tgz and the summary to $OUT/gpu_multi_summary.txt, written at exit
# (also on a timeout's SIGTERM). SMOKE=1 runs the same logic on the
# CPU backend with a toy model (for checking this script without a GPU).
set -u
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$SECONDS
BUDGET=${BUDGET:-415}
DEST=${OUT:-out}; mkdir -p "$DEST"
L=$(mktemp -d /tmp/gpu_multi_logs.XXXXXX)  # logs; one tarball of them goes to $DEST at exit
W=$(mktemp -d /tmp/gpu_multi.XXXXXX)  # checkpoints (GBs) stay out of $OUT
steps=${*:-build a b c d e h}
SMOKE=${SMOKE:-0}
declare -a summary
note() { summary+=("$1"); echo "== $1"; echo "$1" >>"$L/summary.txt"; }
has() { [[ " $steps " == *" $1 "* ]]; }
left() { echo $((BUDGET - (SECONDS - T0))); }
# A step's time limit: its cap, or what is left of the budget (minus 5 s to write the summary).
limit() { local l; l=$(($(left) - 5)); [ "$1" -lt "$l" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }
enough() { [ "$(left)" -ge "$1" ] || { note "$2: skipped, $(left) s of the budget left (needs ~$1 s)"; return 1; }; }
: >"$L/summary.txt"

# Every rank this script starts writes its pid (launch_local.sh: LOG_DIR/rank_<r>.pid; single runs:
# $W/*.pid); whatever is left when a step ends (a timeout) is killed by that pid, nothing else.
reap() { for f in "$@"; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done; return 0; }
trap 'reap "$W"/*.pid "$W"/*/rank_*.pid; rm -rf "$W"; cp "$L/summary.txt" "$DEST/gpu_multi_summary.txt";
      tar czf "$DEST/gpu_multi_logs.tgz" -C "$L" .' EXIT
trap 'exit 143' TERM INT

if [ "$SMOKE" = 1 ]; then
  BACKEND=(--set parallel.backend=cpu --set parallel.threads=1)
  SMALL_MODEL=(--set model.dim=64 --set model.n_heads=4 --set model.n_kv_heads=2 --set model.ffn_dim=128
               --set model.n_layers=2 --set batch.micro_batch=1 --set batch.global_batch=4 --set batch.seq_len=32)
  BIG_MODEL=(--set model.dim=128 --set model.n_heads=4 --set model.n_kv_heads=2 --set model.ffn_dim=256
             --set batch.seq_len=128)
  E_ARGS=(--set model.dim=64 --set model.n_heads=4 --set model.n_kv_heads=2 --set model.ffn_dim=128 --set model.n_layers=2
          --set batch.seq_len=64)
else
  BACKEND=(--set parallel.backend=cuda --set parallel.threads=16)
  # configs/small.yaml, narrower and shallower (143M parameters, most of them the Llama-3 vocabulary)
  SMALL_MODEL=(--set model.dim=512 --set model.n_heads=8 --set model.n_kv_heads=4 --set model.ffn_dim=1408
               --set model.n_layers=4 --set batch.micro_batch=8 --set batch.global_batch=32 --set batch.seq_len=1024)
  BIG_MODEL=()
  E_ARGS=()
fi
DATA=(--set data.train=.deps/novels/nv_train_000000.bin --set data.val= --set eval.interval=0
      --set checkpoint.dir= --set checkpoint.resume=false --set logging.interval=1 --set parallel.data_parallel=1)
SMALL=(configs/small.yaml "${DATA[@]}" "${BACKEND[@]}" "${SMALL_MODEL[@]}" --set schedule.total_steps=30
       --set schedule.warmup_steps=5 --set optim.lr=1e-3 --set precision.recipe=bf16 --set parallel.deterministic=true
       --set parallel.timeout_s=60)

# One GPU: run NAME GPU SECONDS ARGS... in the background (CUDA_VISIBLE_DEVICES=GPU, world 1);
# collect with `wait`. Log: $L/NAME.log, metrics $L/NAME.jsonl.
run1() {
  local name=$1 gpu=$2 secs=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu timeout -k 5 "$secs" ./train "$@" --set logging.file="$L/$name.jsonl" >"$L/$name.log" 2>&1 &
  echo $! >"$W/$name.pid"
}
# N ranks through scripts/runs/launch_local.sh: runN NAME N SECONDS ARGS...; returns launch_local's status.
runN() {
  local name=$1 n=$2 secs=$3; shift 3
  LOG_DIR="$W/$name" timeout -k 5 "$secs" scripts/runs/launch_local.sh "$n" "$@" --set parallel.data_parallel="$n" \
    --set logging.file="$L/$name.jsonl" \
    >"$L/$name.log" 2>&1
  local rc=$? f
  reap "$W/$name"/rank_*.pid
  for f in "$W/$name"/rank_*.log; do [ -f "$f" ] && cp "$f" "$L/${name}_$(basename "$f")"; done
  return $rc
}
# Python over the JSONL logs: stats.py CMD FILES...
stats() {
  python3 - "$@" <<'PY'
import json, math, statistics, sys
def read(p):
    d = {}
    try:
        for line in open(p):
            j = json.loads(line)
            if "loss" in j and "event" not in j: d[j["step"]] = j
    except (OSError, ValueError):
        pass
    return d
cmd, files = sys.argv[1], sys.argv[2:]
if cmd == "maxdiff":    # max |loss a - loss b| over common steps, and how many
    a, b = read(files[0]), read(files[1])
    common = [s for s in a if s in b]
    print(f"{max(abs(a[s]['loss'] - b[s]['loss']) for s in common):.3g} {len(common)}" if common else "nan 0")
elif cmd == "exact":    # identical losses and norms on the common steps?
    a, b = read(files[0]), read(files[1])
    common = sorted(s for s in a if s in b)
    bad = [s for s in common if (a[s]["loss"], a[s]["grad_norm"]) != (b[s]["loss"], b[s]["grad_norm"])]
    print(f"{'identical' if common and not bad else 'DIFFERENT'} {len(common)} {bad[0] if bad else '-'}")
elif cmd == "speed":    # median tok/s/GPU after `skip` steps, peak memory, first and last loss
    d, skip = read(files[0]), int(files[1])
    rows = [d[s] for s in sorted(d) if s > skip] or [d[s] for s in sorted(d)]
    if not rows:
        print("nan nan nan nan 0"); sys.exit()
    tps = statistics.median(r.get("tok_per_s_gpu", r["tok_per_s"]) for r in rows)
    mem = max(max(r.get("mem_peak_gb", 0), r.get("dev_mem_gb", 0)) for r in d.values())
    first, last = d[min(d)]["loss"], d[max(d)]["loss"]
    print(f"{tps:.0f} {mem:.1f} {first:.4f} {last:.4f} {len(d)}")
elif cmd == "lt":       # a < b ?
    sys.exit(0 if float(files[0]) < float(files[1]) else 1)
PY
}
gflop() { ./train "$@" --dry-run 2>/dev/null | grep -o '[0-9.]* GFLOP/token' | cut -d' ' -f1; }
mfu() { python3 -c "import sys; print(f'{float(sys.argv[1]) * float(sys.argv[2]) * 1e9 / 989e12 * 100:.1f}')" "$1" "$2" 2>/dev/null || echo nan; }
# Peak memory.used per GPU over a step, from nvidia-smi every 0.5 s: smi_start; ...; smi_stop -> "a/b GB".
smi_start() { [ "$SMOKE" = 1 ] && return; (while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.5; done >"$W/smi.txt" 2>/dev/null) & echo $! >"$W/smi.pid"; }
smi_stop() {
  [ "$SMOKE" = 1 ] && { echo "n/a"; return; }
  reap "$W/smi.pid"; rm -f "$W/smi.pid"
  awk 'NR % 2 == 1 { if ($1 > a) a = $1 } NR % 2 == 0 { if ($1 > b) b = $1 } END { printf "%.1f/%.1f GB", a * 1.048576 / 1000, b * 1.048576 / 1000 }' "$W/smi.txt"
}

{
  [ "$SMOKE" = 1 ] || nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  [ "$SMOKE" = 1 ] || nvidia-smi topo -m 2>/dev/null | head -n 4
  echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, $(date -u +%Y-%m-%dT%H:%MZ), steps: $steps"
} | tee "$L/gpu.txt"

# NCCL: ./train dlopens libnccl.so.2; find one when the loader would not (e.g. only PyTorch's wheel).
if [ "$SMOKE" != 1 ] && [ -z "${TRAIN_NCCL_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 '; then
  for d in ${LD_LIBRARY_PATH//:/ } /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu \
           $(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' 2>/dev/null); do
    [ -f "$d/libnccl.so.2" ] && { export TRAIN_NCCL_LIB=$d/libnccl.so.2; break; }
  done
fi
echo "NCCL library: ${TRAIN_NCCL_LIB:-libnccl.so.2 from the loader path}" | tee -a "$L/gpu.txt"

if has build; then
  t=$SECONDS
  if [ "$SMOKE" = 1 ]; then make -j2 train >"$L/build.log" 2>&1; rc=$?
  else AUTO_DEPS=0 timeout "$(limit 300)" make -j32 train DEPS=.deps/root CUDNN_FE=.deps/cudnn_fe/include CUDA_HOME=/usr/local/cuda \
         >"$L/build.log" 2>&1; rc=$?; fi
  if [ $rc -eq 0 ]; then note "build ok ($((SECONDS - t)) s)"
  else tail -n 30 "$L/build.log"; note "build FAILED (exit $rc, $L/build.log)"; exit 1; fi
fi

# ---- a: loss curves ---------------------------------------------------------------------------
if has a && enough 60 "a"; then
  t=$SECONDS
  runN a2 2 "$(limit 80)" "${SMALL[@]}" --set checkpoint.dir="$W/ck" --set checkpoint.interval=15; rc2=$?
  runN a2_after 2 "$(limit 60)" "${SMALL[@]}" --set parallel.overlap_reduce=false; rcn=$?
  runN a2_bf16 2 "$(limit 60)" "${SMALL[@]}" --set parallel.grad_reduce=bf16; rch=$?
  runN a2_whole 2 "$(limit 60)" "${SMALL[@]}" --set parallel.shard_master=false; rcw=$?
  # 1 GPU on GPU 0, while GPU 1 resumes the step-15 checkpoint on 1 GPU (step b's 2 -> 1 half).
  mkdir -p "$W/ck21" && cp -al "$W/ck/rank_0" "$W/ck/rank_1" "$W/ck21/" 2>/dev/null && cp "$W/ck/manifest_00000015.txt" "$W/ck21/" 2>/dev/null
  run1 a1 0 "$(limit 60)" "${SMALL[@]}"
  has b && [ -f "$W/ck21/manifest_00000015.txt" ] && run1 b21 1 "$(limit 60)" "${SMALL[@]}" --set checkpoint.dir="$W/ck21" --resume
  wait; reap "$W"/a1.pid "$W"/b21.pid
  read -r d1 n1 < <(stats maxdiff "$L/a1.jsonl" "$L/a2.jsonl")
  read -r dh nh < <(stats maxdiff "$L/a1.jsonl" "$L/a2_bf16.jsonl")
  read -r same ns at < <(stats exact "$L/a2.jsonl" "$L/a2_after.jsonl")
  read -r samew nw atw < <(stats exact "$L/a2.jsonl" "$L/a2_whole.jsonl")
  read -r _ _ f1 l1 _ < <(stats speed "$L/a1.jsonl" 0)
  sharded=$(grep -c "master weights: fp32 sharded" "$L/a2_rank_0.log" 2>/dev/null); sharded=${sharded:-0}
  [ "$SMOKE" = 1 ] && sharded=host  # the CPU backend keeps whole masters: nothing to compare
  ok=PASS
  { [ $rc2 -eq 0 ] && [ "$n1" = 30 ] && stats lt "$d1" 1e-2 && [ "$same" = identical ] && [ "$ns" = 30 ] &&
    [ "$nh" = 30 ] && stats lt "$dh" 5e-2 && [ "$samew" = identical ] && [ "$nw" = 30 ] && [ "$sharded" != 0 ]; } || ok=FAIL
  note "a $ok: 1 vs 2 GPUs, global batch 32, 30 steps (loss $f1 -> $l1): max |loss diff| fp32 $d1 ($n1 steps), bf16 reduce $dh ($nh steps); overlapped vs after-backward reduction: $same over $ns steps; sharded (${sharded}) vs whole fp32 masters: $samew over $nw steps (exit codes $rc2/$rcn/$rch/$rcw, $((SECONDS - t)) s)"
fi

# ---- b: resume --------------------------------------------------------------------------------
if has b && enough 30 "b"; then
  t=$SECONDS
  if [ -f "$W/ck/manifest_00000015.txt" ]; then
    mkdir -p "$W/ck22" && cp -al "$W/ck/rank_0" "$W/ck/rank_1" "$W/ck22/" && cp "$W/ck/manifest_00000015.txt" "$W/ck22/"
    runN b22 2 "$(limit 60)" "${SMALL[@]}" --set checkpoint.dir="$W/ck22" --resume; rc=$?
    read -r same ns at < <(stats exact "$L/a2.jsonl" "$L/b22.jsonl")
    read -r d21 n21 < <(stats maxdiff "$L/a1.jsonl" "$L/b21.jsonl")
    ok=PASS
    { [ $rc -eq 0 ] && grep -q "resumed from .*manifest_00000015.txt at step 15" "$L/b22_rank_0.log" && [ "$same" = identical ] &&
      [ "$ns" = 15 ] && grep -q "re-sharding the optimizer state from 2 to 1 ranks" "$L/b21.log" &&
      grep -q "step     30/30" "$L/b21.log" && stats lt "$d21" 1e-2; } || ok=FAIL
    note "b $ok: 2-GPU resume at step 15: $same to the uninterrupted run over $ns steps (first difference: $at); 2 -> 1 GPU re-shard resume: $( grep -q 'step     30/30' "$L/b21.log" && echo finished || echo DID NOT FINISH), max |loss diff| vs the 1-GPU run $d21 over $n21 steps ($((SECONDS - t)) s)"
  else
    note "b FAIL: no step-15 checkpoint from step a's 2-GPU run (run step a first)"
  fi
fi

# ---- c and h: a rank dies, a rank hangs ------------------------------------------------------
# Two ranks on the small model; after rank 0 logged 5 steps, rank 1 gets SIGNAL; then waits for rank
# 0 to end. Sets dt (seconds from the signal to rank 0's exit), rc0 (its status) and msg (its first
# error line); rank 0's log is kept as $L/NAME_rank_0.log.
fault_run() {  # NAME SIGNAL TIMEOUT_S CAP_S
  local name=$1 sig=$2 tmo=$3 cap=$4 lpid tk
  KEEP_GOING=1 LOG_DIR="$W/$name" timeout -k 5 "$(limit "$cap")" scripts/runs/launch_local.sh 2 "${SMALL[@]}" \
    --set schedule.total_steps=100000 --set parallel.timeout_s="$tmo" --set parallel.data_parallel=2 \
    --set logging.file="$L/$name.jsonl" >"$L/$name.log" 2>&1 &
  lpid=$!
  for _ in $(seq 600); do k=$(grep -c 'step .*loss' "$W/$name/rank_0.log" 2>/dev/null); [ "${k:-0}" -ge 5 ] && break; sleep 0.1; done
  kill "-$sig" "$(cat "$W/$name/rank_1.pid")"; tk=$SECONDS
  for _ in $(seq 600); do [ -f "$W/$name/rank_0.status" ] && break; sleep 0.1; done
  dt=$((SECONDS - tk))
  reap "$W/$name"/rank_*.pid; wait "$lpid" 2>/dev/null
  rc0=$(cat "$W/$name/rank_0.status" 2>/dev/null || echo "still running")
  cp "$W/$name/rank_0.log" "$L/${name}_rank_0.log"
  msg=$(grep -m 1 -i "error" "$L/${name}_rank_0.log" | cut -c1-240)
}

if has c && enough 45 "c"; then
  fault_run c KILL 30 100
  ok=PASS; { [ "$rc0" != 0 ] && [ "$rc0" != "still running" ] && [ $dt -le 50 ]; } || ok=FAIL
  echo "$msg" | grep -q "rank 1" || ok="$ok (the message does not name rank 1)"
  note "c $ok: SIGKILL of rank 1 after step $(grep -c 'step .*loss' "$L/c_rank_0.log"): rank 0 exited with status $rc0 after $dt s (timeout_s 30): $msg"
fi

# ---- d: scaling -------------------------------------------------------------------------------
S8=(configs/llama3_8b.yaml "${DATA[@]}" "${BACKEND[@]}" --set model.n_layers=4 "${BIG_MODEL[@]}" --set batch.micro_batch=1
    --set schedule.warmup_steps=2 --set precision.recipe=bf16)
if has d && enough 90 "d"; then
  t=$SECONDS
  gf=$(gflop "${S8[@]}")
  run1 d1_acc1 0 "$(limit 100)" "${S8[@]}" --set batch.global_batch=1 --set schedule.total_steps=10
  run1 d1_acc8 1 "$(limit 100)" "${S8[@]}" --set batch.global_batch=8 --set schedule.total_steps=5
  wait; reap "$W"/d1_*.pid
  runN d2_acc1 2 "$(limit 100)" "${S8[@]}" --set batch.global_batch=2 --set schedule.total_steps=10
  runN d2_acc8 2 "$(limit 100)" "${S8[@]}" --set batch.global_batch=16 --set schedule.total_steps=5
  runN d2_acc1_bf16 2 "$(limit 100)" "${S8[@]}" --set batch.global_batch=2 --set schedule.total_steps=10 \
    --set parallel.grad_reduce=bf16
  for acc in 1 8; do
    skip=$([ $acc = 1 ] && echo 3 || echo 1)
    read -r s1 m1 _ _ n1 < <(stats speed "$L/d1_acc$acc.jsonl" $skip)
    read -r s2 m2 _ _ n2 < <(stats speed "$L/d2_acc$acc.jsonl" $skip)
    eff=$(python3 -c "import sys; print(f'{float(sys.argv[2]) / float(sys.argv[1]) * 100:.1f}%')" "$s1" "$s2" 2>/dev/null || echo nan)
    note "d accum $acc: 8B shapes x 4 layers ($gf GFLOP/token), seq 8192, micro 1: 1 GPU $s1 tok/s/GPU (MFU $(mfu "$s1" "$gf")%, $n1 steps), 2 GPUs $s2 tok/s/GPU (MFU $(mfu "$s2" "$gf")%, $n2 steps): scaling efficiency $eff (target >= 95%); peak mem $m1 / $m2 GB"
  done
  read -r s1 _ _ _ _ < <(stats speed "$L/d1_acc1.jsonl" 3)
  read -r s2 _ _ _ n2 < <(stats speed "$L/d2_acc1_bf16.jsonl" 3)
  eff=$(python3 -c "import sys; print(f'{float(sys.argv[2]) / float(sys.argv[1]) * 100:.1f}%')" "$s1" "$s2" 2>/dev/null || echo nan)
  note "d accum 1, parallel.grad_reduce=bf16: 2 GPUs $s2 tok/s/GPU ($n2 steps): scaling efficiency $eff"
  echo "(d took $((SECONDS - t)) s)"
fi

# ---- e: the full 8B on 2 GPUs -----------------------------------------------------------------
E=(configs/llama3_8b.yaml "${DATA[@]}" "${BACKEND[@]}" "${E_ARGS[@]}" --set batch.micro_batch=1 --set batch.global_batch=2
   --set schedule.total_steps=1000 --set schedule.warmup_steps=100 --max-steps 6 --set parallel.recompute=full)
if has e && enough 70 "e"; then
  gf=$(gflop "${E[@]}")
  for recipe in bf16 mxfp4; do
    enough 60 "e $recipe" || continue
    t=$SECONDS; smi_start
    runN "e_$recipe" 2 "$(limit 170)" "${E[@]}" --set precision.recipe=$recipe; rc=$?
    if grep -qi "out of memory" "$L/e_${recipe}_rank_0.log" "$L/e_${recipe}_rank_1.log" 2>/dev/null && [ "$(left)" -ge 90 ]; then
      echo "e $recipe: out of memory with the W^T copies; again with parallel.dgrad_transposed=false"
      mv "$L/e_$recipe.jsonl" "$L/e_${recipe}_oom.jsonl" 2>/dev/null
      runN "e_$recipe" 2 "$(limit 170)" "${E[@]}" --set precision.recipe=$recipe --set parallel.dgrad_transposed=false; rc=$?
    fi
    smi=$(smi_stop)
    read -r s m f l n < <(stats speed "$L/e_$recipe.jsonl" 2)
    sane=FAIL; python3 -c "import math,sys; f,l=float(sys.argv[1]),float(sys.argv[2]); sys.exit(not (math.isfinite(l) and 0 < l < 13 and l <= f + 0.05))" "$f" "$l" 2>/dev/null && sane=ok
    ok=PASS; { [ $rc -eq 0 ] && [ "$n" -ge 6 ] && [ $sane = ok ]; } || ok=FAIL
    note "e $ok $recipe: Llama-3 8B, 32 layers, seq 8192, 2 GPUs, micro 1 x accum 1 x 2, recompute full: $s tok/s/GPU, MFU $(mfu "$s" "$gf")% (BF16-equivalent, $gf GFLOP/token, 989 TFLOP/s), peak mem $m GB tracked, nvidia-smi $smi; loss $f -> $l over $n steps ($sane) (exit $rc, $((SECONDS - t)) s)"
  done
fi

# h: a hang, not a death (SIGSTOP): rank 0 must stop after parallel.timeout_s
if has h && enough 40 "h"; then
  fault_run h STOP 15 80
  ok=PASS; { [ "$rc0" != 0 ] && [ "$rc0" != "still running" ] && [ $dt -le 35 ]; } || ok=FAIL
  note "h $ok: SIGSTOP of rank 1: rank 0 exited with status $rc0 after $dt s (timeout_s 15): $msg"
fi

echo; echo "=== gpu_multi summary ($(($SECONDS - T0)) s of $BUDGET; $(head -n 1 "$L/gpu.txt"))"
printf '%s\n' "${summary[@]}"
