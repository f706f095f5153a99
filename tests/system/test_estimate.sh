#!/usr/bin/env bash
# scripts/runs/estimate_run.py: reads ./train --bench lines and turns throughput into time and GPU-hours;
# scripts/gpu/profile_summary.py: the per-layer sums of a bench log's profile table (docs/ quotes them).
cd "$(dirname "$0")/../.." || exit 1
. tests/lib.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
printf 'BENCH cuda mxfp4 optimizer every step:        12000 tok/s/GPU  MFU  70.3%%\nBENCH cuda mxfp4 optimizer amortized /512 :    13000 tok/s/GPU  MFU  76.1%%\n' >"$tmp/b.log"
out=$(python3 scripts/runs/estimate_run.py "$tmp/b.log" --gpus 32 --tokens 160e9 2>&1)
# 160e9 / (12000 * 32) / 3600 = 115.74 h; x 32 GPUs = 3,704 GPU-hours
check "every-step rate: 116 h, 3,704 GPU-hours" 'echo "$out" | grep -q "| mxfp4 | every step | 12,000 | 116 h (4.8 days) | 3,704 |"'
check "amortized rate read too" 'echo "$out" | grep -q "| mxfp4 | amortized | 13,000 |"'
out=$(python3 scripts/runs/estimate_run.py --tok-per-s 10000 --gpus 8 --tokens 1e9 --scaling 0.5 2>&1)
# 1e9 / (10000 * 8 * 0.5) / 3600 = 6.94 h
check "scaling efficiency divides the rate" 'echo "$out" | grep -q "6.9 h | 56 |"'
out=$(python3 scripts/runs/estimate_run.py "$tmp/nothing.log" 2>&1); rc=$?
check "a missing log is a one-line error naming it" '[ $rc -ne 0 ] && echo "$out" | grep -q "^error: .*nothing.log: No such file"'
echo "step 1 | loss 3.0" >"$tmp/train.log"
out=$(python3 scripts/runs/estimate_run.py "$tmp/train.log" 2>&1); rc=$?
check "a log without BENCH lines is an error" '[ $rc -ne 0 ] && echo "$out" | grep -q "no .BENCH"'
# A three-kernel table at 2 layers: per layer, GEMM forward (1.0 + 3.0) / 2, attention 0.5.
cat >"$tmp/p.log" <<'T'
where the time goes: one step at 2 layers, B=1, T=8192
op                     calls/step    ms/step   %time         achieved          ceiling   %ceil
gemm fwd gate                2.00      3.000   50.0%   800.00 TFLOP/s   700.00 TFLOP/s  114.3%
gemm fwd q                   2.00      1.000   16.7%   700.00 TFLOP/s   700.00 TFLOP/s  100.0%
attention bwd                2.00      1.000   16.7%   400.00 TFLOP/s                -       -
gemm fwd head                2.00      1.000   16.6%   700.00 TFLOP/s   700.00 TFLOP/s  100.0%
total                                  6.000  100.0%
T
out=$(python3 scripts/gpu/profile_summary.py "$tmp/p.log" 2>&1)
check "profile_summary: per-layer GEMM forward without the head" 'echo "$out" | grep -Eq "GEMM forward +2.00$"'
check "profile_summary: attention per layer, head per step" 'echo "$out" | grep -Eq "attention +0.50$" && echo "$out" | grep -Eq "output head +1.00$"'
out=$(python3 scripts/gpu/profile_summary.py docs/results/2026-11-30/bf16_bench_b3d7a88.log 2>&1)
check "profile_summary: docs/results_bf16.md's 14.8 ms of GEMMs (4.60 + 5.13 + 5.10)" 'echo "$out" | grep -Eq "GEMM forward +4.60$" && echo "$out" | grep -Eq "GEMM dgrad +5.13$"'
# --bound: GEMMs at max(measured, ceiling) summed per layer, AdamW 30 B x 8.03e9 / 4.28 TB/s = 56.3 ms.
out=$(python3 scripts/gpu/profile_summary.py --bound 12000 "$tmp/p.log" 2>&1)
# per layer: (gate 3.0 ms at 800 > ceiling 700, kept + q 1.0) / 2 layers = 2.0; head 1.0;
# step 32 * (2.0 + 3.6) + 1.0 + 56.3 = 236.5 ms
check "profile_summary --bound: GEMMs per layer and the optimizer" 'echo "$out" | grep -q "GEMMs 2.00 ms/layer, head 1.0 ms, optimizer 56.3 ms"'
check "profile_summary --bound: the every-step step time" 'echo "$out" | grep -Eq "optimizer every step +236.5 ms/step"'
# the copy ceiling from the table's memory-bound rows (an H100's 3.00 TB/s: 30 B x 8.03e9 / 3.00 = 80.3 ms)
sed '/^total/i residual                     4.00      0.100    1.7%       2.00 TB/s       3.00 TB/s   66.7%' "$tmp/p.log" >"$tmp/p3.log"
out=$(python3 scripts/gpu/profile_summary.py --bound 12000 "$tmp/p3.log" 2>&1)
check "profile_summary --bound: AdamW at the table's copy ceiling" 'echo "$out" | grep -q "optimizer 80.3 ms" && echo "$out" | grep -q "at 3 TB/s"'
out=$(python3 scripts/gpu/profile_summary.py --bound 12000 docs/results/2026-11-30/mxfp4_bench_38675d0.log 2>&1)
check "profile_summary --bound counts the FP8 GEMMs (docs/results_fp4.md: 16,403 tok/s)" 'echo "$out" | grep -Eq "optimizer every step +499.4 ms/step +16403 tok/s/GPU"'
# --against: the rows that differ from a base log's, per layer (docs/formats.md's fusion table: the SwiGLU
# epilogue 6.331 / 4 = 1.583 ms where up's GEMM took 2.779 / 4 = 0.695), and the whole step's difference
out=$(python3 scripts/gpu/profile_summary.py --against docs/results/2026-12-05/bench_fusion_auto_h100_ed6bc6e.log \
  docs/results/2026-12-05/bench_fusion_on_h100_ed6bc6e.log 2>&1)
check "profile_summary --against: a fused row, a replaced row and the whole step per layer" \
  'echo "$out" | grep -Eq "cutlass gemm fwd\+swiglu up +0.000 -> +1.583 +\+1.583$" && echo "$out" | grep -Eq "fp8 gemm fwd up +0.695 -> +0.000 +-0.695$" && echo "$out" | grep -Eq "the whole step +30.649 -> +32.139 +\+1.490$"'
out=$(python3 scripts/gpu/profile_summary.py --against docs/results/2026-11-30/bf16_bench_b3d7a88.log "$tmp/p.log" 2>&1); rc=$?
check "profile_summary --against: logs profiled at other depths are refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "profiled at"'
# scripts/gpu/gap_summary.py on a hand-made nsys cuda_gpu_trace CSV: kernels at 0-10, 12-20 (2 us gap),
# 20-30 (none), 25-30 inside the previous one, 9,000,040-.. after a 9 ms host pause (left out):
# 2 us idle against 10 + 8 + 10 + 7 = 35 us busy, 2 / 37 = 5.41%.
cat >"$tmp/trace.csv" <<'T'
"Start (ns)","Duration (ns)","Name"
0,10000,"gemm_a"
12000,8000,"rmsnorm"
20000,10000,"gemm_b"
25000,5000,"overlapped"
9000040,7000,"after_pause"
T
out=$(python3 scripts/gpu/gap_summary.py "$tmp/trace.csv" 2>&1)
check "gap_summary: busy and idle time, the host pause left out" 'echo "$out" | grep -q "5 GPU operations, busy 0.0 ms, idle gaps under 5.0 ms 0.0 ms (5.41% of busy + gaps)"'
check "gap_summary: the gap and its neighbours" 'echo "$out" | grep -Eq "^ +2.0  gemm_a -> rmsnorm"'
# scripts/gpu/route_speed_table.py: docs/replication.md's table from the committed route logs
out=$(python3 scripts/gpu/route_speed_table.py docs/results/2026-12-05/bench_route_*_c500659.log 2>&1)
check "route_speed_table: the 27/5 hybrid's row (7,931 amortized, 0.24 of the GB200's 33,121, 0.70 of BF16)" \
  'echo "$out" | grep -q "^| 27/5 depth hybrid .* | 7,012 (41.1%) | 7,931 (46.4%) | 33,121 | 0.24 | 0.70 |$"'
check "route_speed_table: 11 routes in the paper's order, BF16 first" \
  '[ "$(echo "$out" | grep -c "^| [^r-]")" -eq 11 ] && [ "$(echo "$out" | sed -n 3p | cut -d"|" -f2)" = " BF16 " ]'
head -n 20 docs/results/2026-12-05/bench_route_bf16_c500659.log >"$tmp/bench_route_bf16.log"  # cut off
out=$(python3 scripts/gpu/route_speed_table.py --gpu H100 "$tmp/bench_route_bf16.log" \
  docs/results/2026-12-05/bench_route_mxfp4_rowsr_h32_c500659.log 2>/dev/null)
check "route_speed_table: a bench that did not finish gets a row saying so, the others theirs; --gpu names the GPU" \
  'echo "$out" | grep -q "^| BF16 | no result | no result | 18,812 | - | - |$" && echo "$out" | grep -q "^| MXFP4 .* | 13,408 (78.5%) | 15,235 (89.2%) |" && echo "$out" | grep -q "^| route | H100, optimizer every step"'
out=$(python3 scripts/gpu/route_speed_table.py "$tmp/b.log" 2>&1); rc=$?
check "route_speed_table: a log that is not a route's is refused, naming it" '[ $rc -ne 0 ] && echo "$out" | grep -q "b.log: not a bench_route_"'
# scripts/gpu/speed_targets.py: issue 30's targets from benches and peers (committed logs of two calls here)
out=$(python3 scripts/gpu/speed_targets.py docs/results/2026-12-05/bench_route_mxfp4_rowsr_h32_c500659.log \
  docs/results/2026-12-05/bench_route_bf16_c500659.log docs/results/2026-12-02/peer_bf16_868eefb.log docs/results/2026-12-02/peer_float8_868eefb.log 2>&1)
check "speed_targets: the runs both ways and each target against its figure" \
  'echo "$out" | grep -q "^| engine mxfp4 | 13,408 | 15,235 |$" && echo "$out" | grep -q "^| mxfp4 / torchao float8 peer, every step | 1.125x | 1.250x | MISSED |$" && echo "$out" | grep -q "^| bf16 / compiled PyTorch, amortized | 1.097x | 1.100x | MISSED |$" && echo "$out" | grep -q "^speed targets: 0 met, 5 not met$"'
out=$(python3 scripts/gpu/speed_targets.py docs/results/2026-12-05/bench_route_mxfp4_rowsr_h32_c500659.log 2>&1)
check "speed_targets: a target whose runs are not in the logs is not passed" \
  'echo "$out" | grep -q "^| bf16 / compiled PyTorch, every step | not in the logs | 1.100x | MISSING |$"'
out=$(python3 scripts/gpu/speed_targets.py docs/results/2026-12-05/bench_route_mxfp4_rowsr_h32_c500659.log \
  docs/results/2026-12-05/bench_route_mxfp4_rowsr_h32_f7ff973.log 2>&1); rc=$?
check "speed_targets: two calls' figures for one run are refused" '[ $rc -ne 0 ] && echo "$out" | grep -q "not one call.s figures"'
# ncu_source_mix.py: an Nsight Compute source page (two SASS lines, one predicated) summed per opcode.
cat >"$tmp/src.csv" <<'T'
==PROF== Connected to process 1
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_long_sb","stall_math","stall_long_sb (Not Issued)"
"0x10","FFMA R1, R2, R3, R4","30","300","10","20","0"
"0x20","@P0 FFMA R5, R2, R3, R4","10","100","10","0","0"
"0x30","LDG.E.128 R8, desc[UR4][R2.64]","60","100","60","0","0"
T
out=$(python3 scripts/gpu/ncu_source_mix.py "$tmp/src.csv" --elements 3200 2>&1)
# FFMA: 400 of 500 warp instructions = 80%, 400 x 32 / 3200 = 4 per element, 40 of 100 samples
check "ncu_source_mix: opcodes summed across predicates, per element and per sample" \
  'echo "$out" | grep -Eq "^FFMA +80.00 +4.00 +40.00$" && echo "$out" | grep -q "long_sb 80.0, math 20.0" &&
   echo "$out" | grep -q "per element by kind: FMA pipe (FFMA, FADD, FMUL) 4.00, the rest 1.00"'
cat >"$tmp/lines.csv" <<'T'
"File Path","/src/fp4/a.cuh"
"Line No","Source","Address","Source","Instructions Executed"
"10","x = a * b;","-","-","300"
"","","0x10","FMUL R1, R2, R3","300"
"File Path","/src/fp4/b.h"
"Line No","Source","Address","Source","Instructions Executed"
"7","y = x + 1;","-","-","100"
T
out=$(python3 scripts/gpu/ncu_source_mix.py "$tmp/lines.csv" --elements 3200 --lines 2 2>&1)
# 400 warp instructions x 32 / 3200 elements = 4 per element; a.cuh:10 holds 3 of them
check "ncu_source_mix --lines: per file and per source line, per element" \
  'echo "$out" | grep -q "4.00 thread instructions per element" && echo "$out" | grep -Eq "a.cuh:10 +3.00  x = a \* b;"'
out=$(python3 scripts/gpu/ncu_source_mix.py "$tmp/b.log" 2>&1); rc=$?
check "ncu_source_mix: a file without a source page is an error naming it" '[ $rc -ne 0 ] && echo "$out" | grep -q "b.log: no source table"'
echo "$pass passed, $fail failed"
