#!/usr/bin/env bash
# Short device call: build kiln_cli, tg128 with the bandwidth GEMV on / off (KILN_CUDA_MMVQ_FAST), and an ncu
# per-kernel profile of one decode step (carry .carry/debs). Logs to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/kiln-ab}; mkdir -p "$OUT"; T0=$(date +%s)
DEPS=/tmp/kiln-deps; mkdir -p $DEPS && for f in .carry/debs/*.deb; do dpkg -x "$f" $DEPS; done
export LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu" LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu"
cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$DEPS/usr" >"$OUT/configure.log" 2>&1 && cmake --build build/device -j16 --target kiln_cli >"$OUT/build.log" 2>&1 || exit 1
K=build/device/bin/kiln M=/tmp/m8b.gguf; $K synth --shape llama3-8b --type q4_k_m -o $M >/dev/null || exit 1
echo "== built $(( $(date +%s) - T0 )) s"
for f in 1 0; do echo "fast=$f"; KILN_CUDA_MMVQ_FAST=$f $K bench -m $M -p 0 -n 128 -r 3 2>&1 | grep tg128; done
timeout 50 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  --csv --print-units base $K bench -m $M -p 0 -n 1 -r 1 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"; echo "== ncu rc=$? $(( $(date +%s) - T0 )) s"
