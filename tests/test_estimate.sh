#!/usr/bin/env bash
# scripts/estimate_run.py: reads ./train --bench lines and turns throughput into time and GPU-hours.
cd "$(dirname "$0")/.." || exit 1
pass=0 fail=0
check() { if eval "$2"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
printf 'BENCH cuda mxfp4 optimizer every step:        12000 tok/s/GPU  MFU  70.3%%\nBENCH cuda mxfp4 optimizer amortized /512 :    13000 tok/s/GPU  MFU  76.1%%\n' >"$tmp/b.log"
out=$(python3 scripts/estimate_run.py "$tmp/b.log" --gpus 32 --tokens 160e9 2>&1)
# 160e9 / (12000 * 32) / 3600 = 115.74 h; x 32 GPUs = 3,704 GPU-hours
check "every-step rate: 116 h, 3,704 GPU-hours" 'echo "$out" | grep -q "| mxfp4 | every step | 12,000 | 116 h (4.8 days) | 3,704 |"'
check "amortized rate read too" 'echo "$out" | grep -q "| mxfp4 | amortized | 13,000 |"'
out=$(python3 scripts/estimate_run.py --tok-per-s 10000 --gpus 8 --tokens 1e9 --scaling 0.5 2>&1)
# 1e9 / (10000 * 8 * 0.5) / 3600 = 6.94 h
check "scaling efficiency divides the rate" 'echo "$out" | grep -q "6.9 h | 56 |"'
out=$(python3 scripts/estimate_run.py "$tmp/nothing.log" 2>&1); rc=$?
check "a missing log is a one-line error naming it" '[ $rc -ne 0 ] && echo "$out" | grep -q "^error: .*nothing.log: No such file"'
echo "step 1 | loss 3.0" >"$tmp/train.log"
out=$(python3 scripts/estimate_run.py "$tmp/train.log" 2>&1); rc=$?
check "a log without BENCH lines is an error" '[ $rc -ne 0 ] && echo "$out" | grep -q "no .BENCH"'
echo "$pass passed, $fail failed"
