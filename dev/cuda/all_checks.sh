#!/usr/bin/env bash
# Extra stage of dev/cuda/snap_run.sh (build dir $1): the kernel benchmarks (mmq, fattn), the Qwen3.5/Gemma 3
# op tests on CUDA, graph node overhead, racecheck on the flash-attention kernel. Summary lines on stdout.
set -u
B=$1; cd "$(dirname "$0")/../.."; OUT=${OUT:-/tmp}
timeout 100 $B/tests/test_backend_ops_next --gtest_filter='*cuda*' > $OUT/ops_next.log 2>&1; echo "== ops_next cuda rc=$?"
grep -E "^\[  (FAILED|PASSED) " $OUT/ops_next.log | head; grep -B2 -A8 "Failure" $OUT/ops_next.log | head -30
timeout 120 $B/dev/cuda/mmq_bench > $OUT/mmq_bench.log 2>&1; echo "== mmq_bench rc=$?"; tail -30 $OUT/mmq_bench.log
timeout 120 $B/dev/cuda/fattn_bench --quick > $OUT/fattn_bench.log 2>&1; echo "== fattn_bench rc=$?"; tail -20 $OUT/fattn_bench.log
nvcc -O2 -arch=sm_90 -o /tmp/graph_overhead dev/cuda/graph_overhead.cu && /tmp/graph_overhead
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 150 $CS --tool racecheck --error-exitcode 9 $B/tests/test_backend_cuda_fattn --gtest_filter='*LaneMaps*:*WindowSkips*' > $OUT/racecheck.log 2>&1
echo "== racecheck fattn rc=$? $(grep 'ERROR SUMMARY' $OUT/racecheck.log | tail -1)"
