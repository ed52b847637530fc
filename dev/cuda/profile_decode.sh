#!/usr/bin/env bash
# One device call: build kiln (sm_90), write the llama3-8b q4_k_m synth file, measure the copy ceiling, baseline
# tg/pp (graphs on / off, depth 4096), and an ncu per-kernel profile (duration, DRAM bytes) of a few decode steps.
#   dev/cuda/profile_decode.sh      (carry .carry; logs + ncu.csv to $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/kiln-prof}; mkdir -p "$OUT"
DEPS=/tmp/kiln-deps; mkdir -p $DEPS && for f in .carry/debs/*.deb; do dpkg -x "$f" $DEPS; done
export LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu" LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu"
t0=$(date +%s)
cmake -S . -B build/device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$DEPS/usr" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/device -j16 --target kiln_cli >"$OUT/build.log" 2>&1 || { grep -A12 -E "error|FAILED" "$OUT/build.log" | head -60; exit 1; }
echo "== build $(( $(date +%s) - t0 )) s"
K=build/device/bin/kiln M=/tmp/m8b.gguf
[ -f $M ] || $K synth --shape llama3-8b --type q4_k_m -o $M >/dev/null || exit 1
echo "== synth $(( $(date +%s) - t0 )) s"
nvcc -O2 -o /tmp/copy_bw bench/cuda_copy_bw.cu && /tmp/copy_bw | tee "$OUT/copy.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
KILN_CUDA_GRAPH_STATS=1 $K bench -m $M -p 512 -n 128 -r 3 2>&1 | tee "$OUT/bench_base.txt" | grep -E "pp|tg|graphs"
KILN_CUDA_GRAPHS=0 KILN_CUDA_GRAPH_STATS=1 $K bench -m $M -p 0 -n 128 -r 2 2>&1 | grep -E "tg|graphs"
$K bench -m $M -p 0 -n 32 -d 4096 -r 2 2>&1 | grep -E "tg"
echo "== bench $(( $(date +%s) - t0 )) s"
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  --csv --print-units base $K bench -m $M -p 0 -n 3 -r 1 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"; echo "== ncu rc=$? $(( $(date +%s) - t0 )) s"
tail -3 "$OUT/ncu.err"; wc -l "$OUT/ncu.csv"
