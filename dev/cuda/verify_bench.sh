#!/usr/bin/env bash
# One device call after a kernel change (carry .carry/debs and .carry/fixtures): build (sm_90), a first kiln bench,
# the CUDA tests (op tests, ctest -L cuda = parity of every carried fixture at -b 1/7/64, the CUDA instances of
# test_backend_ops), compute-sanitizer memcheck on the op tests, then 3 kiln bench rounds (tg128 + pp512, -r 3),
# tg32 at depth 4096, and an ncu per-kernel profile of one decode step when time is left. Logs to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-verify}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
DEPS=/tmp/kiln-deps; mkdir -p $DEPS && for f in .carry/debs/*.deb; do dpkg -x "$f" $DEPS; done
export LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu" LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu"
cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_FIXTURES_DIR="$PWD/.carry/fixtures" -DCMAKE_PREFIX_PATH="$DEPS/usr" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/device -j16 --target kiln_cli test_backend_cuda_ops test_model_parity test_backend_ops >"$OUT/build.log" 2>&1 \
  || { grep -A12 -E "error|FAILED" "$OUT/build.log" | head -60; exit 1; }
echo "== build $(el) s"
K=build/device/bin/kiln M=/tmp/m8b.gguf
$K synth --shape llama3-8b --type q4_k_m -o $M >/dev/null || exit 1
nvcc -O2 -o /tmp/copy_bw bench/cuda_copy_bw.cu && /tmp/copy_bw | tee "$OUT/copy.txt"
$K bench -m $M -p 512 -n 128 -r 3 2>&1 | tee "$OUT/bench.0.txt" | grep -E "pp512|tg128"
echo "== first bench $(el) s"
timeout 120 build/device/tests/test_backend_cuda_ops > "$OUT/cuda_ops.log" 2>&1; echo "== cuda op tests rc=$? $(el) s"
grep -E "^\[  (FAILED|PASSED) " "$OUT/cuda_ops.log" | head; grep -B2 -A6 "Failure" "$OUT/cuda_ops.log" | head -40
timeout 120 build/device/tests/test_backend_ops --gtest_filter='*cuda*' > "$OUT/backend_ops.log" 2>&1; echo "== test_backend_ops cuda rc=$? $(el) s"
grep -E "^\[  (FAILED|PASSED) " "$OUT/backend_ops.log" | head; grep -B2 -A6 "Failure" "$OUT/backend_ops.log" | head -40
(cd build/device && timeout 150 ctest -L cuda -j16 --output-on-failure --timeout 140 > "$OUT/ctest.log" 2>&1); echo "== ctest -L cuda rc=$? $(el) s"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" "$OUT/ctest.log" | head -20
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 build/device/tests/test_backend_cuda_ops > "$OUT/san_memcheck.log" 2>&1
echo "== memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/san_memcheck.log" | tail -1) $(el) s"
for i in 1 2; do $K bench -m $M -p 512 -n 128 -r 3 2>&1 | tee "$OUT/bench.$i.txt" | grep -E "tg128"; done
$K bench -m $M -p 0 -n 32 -d 4096 -r 2 2>&1 | tee "$OUT/bench.d4096.txt" | grep tg32
echo "== bench $(el) s"
if [ "$(el)" -lt 215 ]; then
  timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --print-units base $K bench -m $M -p 0 -n 1 -r 1 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"; echo "== ncu rc=$? $(el) s"
fi
