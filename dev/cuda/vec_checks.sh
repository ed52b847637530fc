#!/usr/bin/env bash
# The decode attention kernels (attn_vec_kernel, attn_kernel): op tests, tg at depth, parity on cuda:0.
set -u
B=$1; OUT=${OUT:-/tmp}; M=/tmp/m8b.gguf
timeout 100 $B/tests/test_backend_ops --gtest_filter='*Attention*cuda*' > $OUT/v_ops.log 2>&1; echo "== ops attention cuda rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $OUT/v_ops.log | tr '\n' ' ')"
grep -B2 -A6 Failure $OUT/v_ops.log | head -20
timeout 100 $B/tests/test_backend_cuda_ops --gtest_filter='*Attention*' > $OUT/v_cops.log 2>&1; echo "== cuda_ops attention rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $OUT/v_cops.log | tr '\n' ' ')"
timeout 150 $B/tests/test_backend_cuda_fattn > $OUT/v_fa.log 2>&1; echo "== fattn tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $OUT/v_fa.log | tr '\n' ' ')"
grep -B2 -A6 Failure $OUT/v_fa.log | head -20
timeout 100 $B/tests/test_backend_ops_next --gtest_filter='*Window*cuda*' > $OUT/v_next.log 2>&1; echo "== window cuda rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $OUT/v_next.log | tr '\n' ' ')"
for d in 4096 8192; do
  echo "d=$d: $($B/bin/kiln bench -m $M -p 0 -n 32 -d $d -r 2 2>&1 | grep -E 'tg32' | tr -s ' ')"
done
timeout 150 $B/tests/test_model_parity --gtest_filter='*Parity*cuda_0*' > $OUT/v_par.log 2>&1; echo "== parity cuda rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $OUT/v_par.log | tr '\n' ' ')"
grep -E "^\[  FAILED  \] Fix" $OUT/v_par.log | head
