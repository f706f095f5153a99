#!/usr/bin/env bash
# Nsight Compute on the FP4 producers of gpu_test_fp4_mx's benchmark: where each kernel's time goes
# (issue slots, pipes, warp stalls, memory). Needs ncu (the GPU machine's CUDA toolkit has it) and a built
# build/gpu_tests/gpu_test_fp4_mx. Reports go to $OUT.
#   bash scripts/gpu/ncu_producers.sh [skip:name:kernel:elements ...]
# Each argument: SKIP, the number of launches of KERNEL (a name regex) to skip before the one profiled
# (each benchmark case runs 3 + 15 times, in the order of the table; mx_dual_kernel runs 7 cases per
# activation shape, mx_weight_kernel 3 per weight shape), a label, and the case's element count (for
# thread-instructions per element). Default: the in-step dY producer (SR rows + H32 BLK128x128 columns) at
# 8192 x 14336 and 8192 x 4096, and the BF16 weight producer at 14336 x 4096.
set -u
cd "$(dirname "$0")/../.."
DEST=${OUT:-out}; mkdir -p "$DEST"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
cases=${*:-"162:dy_blk_8192x14336:mx_dual_kernel:117440512 36:dy_blk_8192x4096:mx_dual_kernel:33554432 90:w_bf16_14336x4096:mx_weight_kernel:58720256"}
for c in $cases; do
  IFS=: read -r skip name kernel elems <<<"$c"
  "$NCU" --clock-control none --kernel-name regex:"$kernel" --launch-skip "$skip" --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
    --section WarpStateStats --section InstructionStats --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis build/gpu_tests/gpu_test_fp4_mx --bench-only >"$DEST/ncu_$name.txt" 2>&1
  echo "== $name (launch $skip)"
  grep -E "Duration|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Executed Ipc Active|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Executed Instructions  |Stall|stall|pipe|Pipe|ERR" "$DEST/ncu_$name.txt" | head -40
  # thread-instructions per element: executed warp instructions x 32 / elements
  awk -v n="$elems" '/Executed Instructions  / {gsub(",", "", $NF); printf "    thread-instructions per element %.1f\n", $NF * 32 / n}' \
    "$DEST/ncu_$name.txt"
done
# Per SASS line (NCU_SOURCE=1): each case's source page as CSV, summarized per opcode and stall reason by
# scripts/gpu/ncu_source_mix.py (thread-instructions per element, where the samples fall).
if [ -n "${NCU_SOURCE:-}" ]; then
  for c in $cases; do
    IFS=: read -r skip name kernel elems <<<"$c"
    "$NCU" --clock-control none --kernel-name regex:"$kernel" --launch-skip "$skip" --launch-count 1 \
      --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
      build/gpu_tests/gpu_test_fp4_mx --bench-only >"$DEST/ncu_source_$name.csv" 2>&1
    python3 scripts/gpu/ncu_source_mix.py "$DEST/ncu_source_$name.csv" --elements "$elems" --top 12
    # per source line: NCU_LINEINFO_BIN=build/prof/gpu_test_fp4_mx_lineinfo (make that target first)
    if [ -n "${NCU_LINEINFO_BIN:-}" ]; then
      "$NCU" --clock-control none --kernel-name regex:"$kernel" --launch-skip "$skip" --launch-count 1 \
        --section SourceCounters --page source --print-source cuda,sass --csv "$NCU_LINEINFO_BIN" --bench-only \
        >"$DEST/ncu_lines_$name.csv" 2>&1
      python3 scripts/gpu/ncu_source_mix.py "$DEST/ncu_lines_$name.csv" --elements "$elems" --lines 40
    fi
  done
fi
# Why warps wait (per issued instruction), for the first case: NCU_STALLS=1.
if [ -n "${NCU_STALLS:-}" ]; then
  c=${cases%% *}; IFS=: read -r skip name kernel elems <<<"$c"
  "$NCU" --clock-control none --kernel-name regex:"$kernel" --launch-skip "$skip" --launch-count 1 \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    build/gpu_tests/gpu_test_fp4_mx --bench-only >"$DEST/ncu_stalls.txt" 2>&1
  echo "== stalls (launch $skip)"
  grep -E "stalled" "$DEST/ncu_stalls.txt" | awk '$NF+0 > 0.05' | sort -k3 -g -r | head -14
fi
