#!/usr/bin/env bash
# Nsight Compute on the FP4 producers at 8192 x 4096 (the first shape of gpu_test_fp4_mx's benchmark):
# where each kernel's time goes (issue slots, pipes, warp stalls, memory). Needs ncu (the GPU
# machine's CUDA toolkit has it) and a built build/gpu_tests/gpu_test_fp4_mx. Reports go to $OUT.
#   bash scripts/gpu/ncu_producers.sh [skip:name ...]
# Each argument is LAUNCH_SKIP:NAME, the number of matching launches to skip before the one profiled
# (each benchmark case runs 3 + 15 times, in the order of the table) and a label.
set -u
cd "$(dirname "$0")/../.."
DEST=${OUT:-out}; mkdir -p "$DEST"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
cases=${*:-"18:dual_fp8_sr_h32 54:dual_fp8_sr_rows_only 72:dual_fp8_h32_cols_only 90:dual_fp8_cols_only"}
for c in $cases; do
  skip=${c%%:*} name=${c#*:}
  "$NCU" --kernel-name regex:'mx_dual_kernel' --launch-skip "$skip" --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
    --section WarpStateStats --section InstructionStats --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis build/gpu_tests/gpu_test_fp4_mx --bench-only >"$DEST/ncu_$name.txt" 2>&1
  echo "== $name (launch $skip)"
  grep -E "Duration|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Executed Ipc Active|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Theoretical Occupancy|Executed Instructions  |Stall|stall|pipe|Pipe|ERR" "$DEST/ncu_$name.txt" | head -40
  # thread-instructions per element: executed warp instructions x 32 / (8192 x 4096 elements)
  awk '/Executed Instructions  / {gsub(",", "", $NF); printf "    thread-instructions per element %.1f\n", $NF * 32 / (8192 * 4096)}' \
    "$DEST/ncu_$name.txt"
done
# Why warps wait (per issued instruction), for the first case: NCU_STALLS=1.
if [ -n "${NCU_STALLS:-}" ]; then
  c=${cases%% *}; skip=${c%%:*}
  "$NCU" --kernel-name regex:'mx_dual_kernel' --launch-skip "$skip" --launch-count 1 \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    build/gpu_tests/gpu_test_fp4_mx --bench-only >"$DEST/ncu_stalls.txt" 2>&1
  echo "== stalls (launch $skip)"
  grep -E "stalled" "$DEST/ncu_stalls.txt" | awk '$NF+0 > 0.05' | sort -k3 -g -r | head -14
fi
