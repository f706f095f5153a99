#!/usr/bin/env bash
# scripts/runs/launch_local.sh N CONFIG [train args...]: N data-parallel ranks of ./train on this node.
#
# Each rank gets RANK, WORLD_SIZE, LOCAL_RANK (its GPU), MASTER_ADDR=127.0.0.1 and a free
# MASTER_PORT (parallel/comm.h), and --set parallel.data_parallel=N unless the arguments set it.
# Rank 0's output goes to the terminal; every rank's output also goes to LOG_DIR/rank_<r>.log
# (LOG_DIR defaults to a temp dir; ALL_RANKS=1 shows every rank, each line prefixed "[r] ").
# When one rank fails, the others are stopped and the script exits with that rank's status; with
# KEEP_GOING=1 they are left to notice on their own (how a real failure looks to them; the fault
# tests use it). Each rank's pid goes to LOG_DIR/rank_<r>.pid, its exit status to rank_<r>.status.
# NCCL_NVLS_ENABLE is exported as 0 (NVLink multicast stays off; ./train forces it too).
#   scripts/runs/launch_local.sh 8 configs/paper/bf16.yaml --resume
set -u
if [ $# -lt 2 ]; then echo "usage: $0 N CONFIG [train args...]" >&2; exit 2; fi
N=$1; shift
case $N in ''|*[!0-9]*|0) echo "$0: N must be a positive number, got '$N'" >&2; exit 2;; esac
cd "$(dirname "$0")/../.." || exit 1
TRAIN=${TRAIN:-./train}
LOG_DIR=${LOG_DIR:-$(mktemp -d /tmp/launch_local.XXXXXX)}
mkdir -p "$LOG_DIR"

# A free port: bind port 0 and read back what the kernel chose (python3 when present).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null \
       || echo $((20000 + RANDOM % 20000)))
set_dp=(--set "parallel.data_parallel=$N")
for a in "$@"; do case $a in parallel.data_parallel=*) set_dp=();; esac; done

export WORLD_SIZE=$N MASTER_ADDR=127.0.0.1 MASTER_PORT=$port NCCL_NVLS_ENABLE=0
rm -f "$LOG_DIR"/rank_*.pid "$LOG_DIR"/rank_*.status
pids=()
for ((r = 0; r < N; r++)); do
  if [ "$r" -eq 0 ] || [ "${ALL_RANKS:-0}" = 1 ]; then
    # stdbuf keeps lines whole; sed prefixes them when several ranks share the terminal
    RANK=$r LOCAL_RANK=$r "$TRAIN" "$@" "${set_dp[@]}" > >(if [ "${ALL_RANKS:-0}" = 1 ]; then
        sed -u "s/^/[$r] /" | tee "$LOG_DIR/rank_$r.log"; else tee "$LOG_DIR/rank_$r.log"; fi) 2>&1 &
  else
    RANK=$r LOCAL_RANK=$r "$TRAIN" "$@" "${set_dp[@]}" > "$LOG_DIR/rank_$r.log" 2>&1 &
  fi
  pids+=($!)
  echo $! > "$LOG_DIR/rank_$r.pid"
done

# Wait for the first rank to finish; if it failed, stop the others and report which one it was.
status=0
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
trap 'stop_all; exit 130' INT TERM
left=$N
while [ "$left" -gt 0 ]; do
  wait -n -p done_pid "${pids[@]}" 2>/dev/null; rc=$?
  [ -z "${done_pid:-}" ] && break
  left=$((left - 1))
  who=; for ((r = 0; r < N; r++)); do [ "${pids[$r]}" = "$done_pid" ] && who=$r; done
  echo "$rc" > "$LOG_DIR/rank_${who:-x}.status"
  if [ "$rc" -ne 0 ] && [ "${KEEP_GOING:-0}" = 1 ]; then
    echo "launch_local: rank ${who:-?} exited with status $rc (log: $LOG_DIR/rank_${who:-?}.log)" >&2
    [ "$status" -eq 0 ] && status=$rc
  elif [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
    echo "launch_local: rank ${who:-?} exited with status $rc (log: $LOG_DIR/rank_${who:-?}.log); stopping the others" >&2
    [ "${who:-0}" != 0 ] && tail -n 5 "$LOG_DIR/rank_${who}.log" >&2
    status=$rc
    stop_all
  fi
  unset done_pid
done
exit $status
