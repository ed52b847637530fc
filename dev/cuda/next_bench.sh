#!/usr/bin/env bash
# Issue 18 on the GPU: qwen3.5-9b and gemma3-12b q4_k_m synth, kiln bench vs llama-bench (pp512 / tg128, -r 3), one
# round each, in one call. Carry .carry/debs and .carry/peer-bin (llama-bench.xz).
set -uo pipefail
OUT=${OUT:-/tmp}; T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
DEPS=/tmp/kiln-deps; mkdir -p $DEPS && for f in .carry/debs/*.deb; do dpkg -x "$f" $DEPS; done
export LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu" LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu"
B=/tmp/kb
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DKILN_TESTS=OFF \
  -DCMAKE_PREFIX_PATH="$DEPS/usr" > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build $B -j"$(nproc)" --target kiln_cli > $OUT/build.log 2>&1 || { grep -A10 -E "error|FAILED" $OUT/build.log | head -40; exit 1; }
echo "== build $(el) s"
L=/tmp/llama-bench; [ -x $L ] || { xz -dc .carry/peer-bin/llama-bench.xz > $L && chmod +x $L; }
for sh in qwen3.5-9b gemma3-12b; do
  M=/tmp/$sh.gguf
  $B/bin/kiln synth --shape $sh --type q4_k_m -o $M 2>&1 | tail -1
  echo "kiln $sh: $(timeout 90 $B/bin/kiln bench -m $M -p 512 -n 128 -r 3 2>&1 | grep -E 'pp512|tg128|rror' | tr -s ' ' | tr '\n' ' ')"
  echo "llama.cpp $sh: $(timeout 90 $L -m $M -p 512 -n 128 -r 3 -ngl 99 2>&1 | grep -E 'pp512|tg128|rror' | tr -s ' ' | tr '\n' ' ')"
  rm -f $M
  echo "== $sh $(el) s"
done
