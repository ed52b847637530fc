#!/usr/bin/env bash
# On the GPU machine: builds and runs the flash-attention prefill checks (fattn_mma.cu) and the benchmark.
# Usage: dev/cuda/fattn_check.sh BUILD_DIR     (a configured build dir with KILN_CUDA=ON; relative to the repo root
# or absolute; JOBS=n caps the build's parallelism). Logs: BUILD_DIR/fattn_check_logs/. Exit 0 when all pass.
set -u
B=${1:?usage: fattn_check.sh BUILD_DIR}
cd "$(dirname "$0")/../.."
ninja -C "$B" -j"${JOBS:-$(nproc)}" test_backend_cuda_fattn test_backend_ops test_backend_ops_next test_backend_cuda_ops fattn_bench || exit 1
declare -A rc
L="$B/fattn_check_logs"
mkdir -p "$L"
run() {  # name, command...: full log in $L/name.log; failures and the tail printed
  local name=$1; shift
  echo "=== $name: $*"
  "$@" > "$L/$name.log" 2>&1
  rc[$name]=$?
  grep -E "Failure|FAILED|rror|over the bound|NMSE" "$L/$name.log" | head -n 40
  tail -n 25 "$L/$name.log"
}
if command -v python3 > /dev/null; then  # host emulation of the fragment maps (no GPU needed)
  run lane_maps python3 dev/cuda/fattn_lane_maps.py
else
  rc[lane_maps]=0; echo "=== lane_maps: skipped (no python3)"
fi
run fattn "$B/tests/test_backend_cuda_fattn"
# (the parameter comes last in the names: Backends/BackendOps.AttentionPagedGqaEveryCacheType/cuda_0)
run ops_attention "$B/tests/test_backend_ops" --gtest_filter='*Attention*cuda*:*cuda*Attention*'
run ops_next "$B/tests/test_backend_ops_next" --gtest_filter='*cuda*'
run cuda_ops_attention "$B/tests/test_backend_cuda_ops" --gtest_filter='*Attention*'
run bench "$B/dev/cuda/fattn_bench"
# Races / out-of-bounds on the small shapes (slow tools: a filter). Skipped when compute-sanitizer is absent.
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
checks="lane_maps fattn ops_attention ops_next cuda_ops_attention bench"
if [ -x "$CS" ]; then
  run racecheck timeout 300 "$CS" --tool racecheck --error-exitcode 9 "$B/tests/test_backend_cuda_fattn" \
      --gtest_filter='*LaneMaps*:*WindowSkips*'
  run memcheck timeout 300 "$CS" --tool memcheck --error-exitcode 9 "$B/tests/test_backend_cuda_fattn" \
      --gtest_filter='*LaneMaps*:*WindowSkips*:*PrefillAndDecode*'
  checks="$checks racecheck memcheck"
fi
echo "=== summary"
fail=0
for k in $checks; do
  echo "$k: rc=${rc[$k]:-missing}"
  [ "${rc[$k]:-1}" = 0 ] || fail=1
done
exit $fail
