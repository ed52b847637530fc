#!/usr/bin/env bash
# One call on the GPU machine (no Debian dev packages, no network there): build kiln with the CUDA backend for
# sm_90 with all cores, list the devices, run the whole test suite, copy the logs to $OUT.
#
# Here, once:   mkdir -p .carry/debs && (cd .carry/debs && apt-get download libpcre2-dev libgtest-dev \
#                 libgmock-dev nlohmann-json3-dev)          # .carry/ is git-ignored; the device tool carries it
# Device call:  bash bench/device_check.sh                  (carry: [".carry"])
set -uo pipefail
OUT=${OUT:-/tmp/kiln-device-out}; mkdir -p "$OUT"
DEPS=/tmp/kiln-deps
mkdir -p "$DEPS" && for f in .carry/debs/*.deb; do dpkg -x "$f" "$DEPS"; done
{
  echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1; g++ --version | head -1; cmake --version | head -1
} 2>&1 | tee "$OUT/env.log"
t0=$(date +%s)
cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$DEPS/usr" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/device -j"$(nproc)" >"$OUT/build.log" 2>&1 || { grep -B2 -A8 -E "error|FAILED" "$OUT/build.log" | head -60; exit 1; }
echo "== configure + build: $(( $(date +%s) - t0 )) s"
build/device/bin/kiln devices 2>&1 | tee "$OUT/devices.log"
build/device/bin/kiln run -p "And God said" -n 24 --temp 0 2>&1 | tee "$OUT/demo.log"
(cd build/device && ctest -j"$(nproc)" --output-on-failure >"$OUT/ctest.log" 2>&1); rc=$?
tail -12 "$OUT/ctest.log"
exit $rc
