#!/usr/bin/env bash
# On the GPU machine: builds and runs the checks of the tensor-core prefill GEMM (src/backend/cuda/mmq.cuh) and its
# benchmark. Usage: dev/cuda/mmq_check.sh BUILD_DIR     (a configured build dir with KILN_CUDA=ON)
# Runs: test_backend_cuda_mmq (model / exact / GEMV-equality checks per type and shape), test_backend_ops'
# CUDA matmul cases (n_tok 17 and 64 reach mmq), test_backend_cuda_ops' matmul case, mmq_bench (llama3-8b shapes).
set -u
B=${1:?usage: mmq_check.sh BUILD_DIR}
cd "$(dirname "$0")/../.."
ninja -C "$B" -j"$(nproc)" test_backend_cuda_mmq test_backend_ops test_backend_cuda_ops mmq_bench || exit 1
declare -A rc
run() {  # name, command...
  local name=$1; shift
  echo "=== $name: $*"
  "$@" 2>&1 | tail -n 80
  rc[$name]=${PIPESTATUS[0]}
}
run mmq "$B/tests/test_backend_cuda_mmq"
run ops_matmul "$B/tests/test_backend_ops" --gtest_filter='*cuda*Matmul*'
run cuda_ops_matmul "$B/tests/test_backend_cuda_ops" --gtest_filter='*Matmul*'
run bench "$B/dev/cuda/mmq_bench"
echo "=== summary"
fail=0
for k in mmq ops_matmul cuda_ops_matmul bench; do
  echo "$k: rc=${rc[$k]:-missing}"
  [ "${rc[$k]:-1}" = 0 ] || fail=1
done
exit $fail
