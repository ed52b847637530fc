#!/usr/bin/env bash
# Final-call extras (build dir $1): the server under load on the GPU (bench/serve_load.sh, 1/8/32/64 streams of a
# 128-token prompt and 128 generated tokens, llama3-8b q4_k_m), the kernel benchmarks.
set -u
B=$1; cd "$(dirname "$0")/../.."; OUT=${OUT:-/tmp}
timeout 120 $B/dev/cuda/mmq_bench > $OUT/mmq_bench.txt 2>&1; echo "== mmq_bench rc=$?"; grep -E "^(q4_K|q6_K|q8_0|f16) " $OUT/mmq_bench.txt | head -16
REQ_PER_STREAM=2 timeout 200 bash bench/serve_load.sh $B/bin/kiln /tmp/m8b.gguf "1 8 32 64" 128 128 2>&1 | tee $OUT/serve.txt
