#!/usr/bin/env bash
# One call on the GPU machine for the CUDA backend (carry: .carry with debs/, optionally fixtures/ and peer-src/):
#   bench/cuda_device_run.sh [STAGES="test bench"]
# stages: test   build kiln (sm_90, all cores), CUDA op tests, ctest (parity on cuda:0 for the carried fixtures)
#         san    compute-sanitizer memcheck + racecheck on the CUDA op tests
#         bench  bench/cuda_vs_llamacpp.sh (llama.cpp built from .carry/peer-src when present, in parallel)
# Logs and a short summary go to $OUT.
set -uo pipefail
STAGES=${1:-"test bench"}
OUT=${OUT:-/tmp/kiln-device-out}; mkdir -p "$OUT"
DEPS=/tmp/kiln-deps
mkdir -p "$DEPS" && for f in .carry/debs/*.deb; do dpkg -x "$f" "$DEPS"; done
NP=$(nproc)
# Shared libraries from the carried packages (cpp-httplib for the server module) at link and run time.
export LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  nvcc --version | tail -1; } 2>&1 | tee "$OUT/env.log"
PEER_PID=
if [[ " $STAGES " == *" bench "* ]] && [ -d .carry/peer-src ]; then
  (bash .carry/llamacpp-cuda.sh .carry/peer-src 90 > "$OUT/peer-build.log" 2>&1) & PEER_PID=$!
fi
FX=${FIXTURES:-$PWD/.carry/fixtures}; [ -d "$FX" ] || FX=/nonexistent
t0=$(date +%s)
cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_FIXTURES_DIR="$FX" -DCMAKE_PREFIX_PATH="$DEPS/usr" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/device -j"$NP" >"$OUT/build.log" 2>&1 || { grep -B2 -A12 -E "error|FAILED" "$OUT/build.log" | head -80; exit 1; }
echo "== build: $(( $(date +%s) - t0 )) s"
build/device/bin/kiln devices 2>&1 | tee -a "$OUT/env.log"
rc=0
if [[ " $STAGES " == *" test "* ]]; then
  timeout 300 build/device/tests/test_backend_cuda_ops > "$OUT/cuda_ops.log" 2>&1; echo "== cuda op tests rc=$?"
  grep -E "^\[  (FAILED|PASSED|SKIPPED) " "$OUT/cuda_ops.log" | head -20
  grep -B3 -A3 "Failure" "$OUT/cuda_ops.log" | head -60
  (cd build/device && timeout 420 ctest -j"$NP" --output-on-failure --timeout 300 >"$OUT/ctest.log" 2>&1); rc=$?
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run" "$OUT/ctest.log" | head -40
  grep -h "\[parity\] cuda" "$OUT/ctest.log" | sort | head -80 > "$OUT/parity_cuda.txt"; wc -l < "$OUT/parity_cuda.txt"
fi
if [[ " $STAGES " == *" san "* ]]; then
  for tool in memcheck racecheck; do
    timeout 240 compute-sanitizer --tool $tool --error-exitcode 3 build/device/tests/test_backend_cuda_ops \
      --gtest_filter='CudaOps.SmallOps*:CudaOps.GetRows*:CudaOps.Attention*' > "$OUT/san_$tool.log" 2>&1
    echo "== compute-sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/san_$tool.log" | tail -1)"
  done
fi
if [[ " $STAGES " == *" bench "* ]]; then
  if [ -n "$PEER_PID" ]; then wait $PEER_PID; echo "== peer build rc=$? ($(( $(date +%s) - t0 )) s)"; export LLAMA_BIN=/tmp/peer-build/bin; else export LLAMA_BIN=none; fi
  [ -x "${LLAMA_BIN}/llama-bench" ] || { tail -20 "$OUT/peer-build.log" 2>/dev/null; export LLAMA_BIN=none; }
  bash bench/cuda_vs_llamacpp.sh llama3-8b q4_k_m 3 2>&1 | tee "$OUT/bench.log" | tail -12
fi
exit $rc
