#!/usr/bin/env bash
# Correctness of the GEMV row-per-block variants (KILN_CUDA_MMVQ_RR) and the two-backend layer split on one GPU.
set -u
B=$1; OUT=${OUT:-/tmp}
for rr in 1 2; do
  KILN_CUDA_MMVQ_RR=$rr timeout 100 $B/tests/test_backend_ops --gtest_filter='*Matmul*cuda*:*Fused*cuda*' > $OUT/rr$rr.log 2>&1
  echo "== test_backend_ops matmul cuda RR=$rr rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $OUT/rr$rr.log | tr '\n' ' ')"
done
timeout 200 $B/tests/test_model_parity --gtest_filter='ModelPlacement.*' > $OUT/placement.log 2>&1
echo "== placement rc=$? $(grep -E '\[placement\]|^\[  (PASSED|FAILED) ' $OUT/placement.log | tr '\n' ' ')"
grep -B2 -A6 Failure $OUT/placement.log | head -30
