#!/usr/bin/env bash
# One device call over a source snapshot (run from the repo root on the GPU machine):
#   dev/cuda/snap_run.sh SRC "stages"      SRC: a tree (e.g. a carried .carry/snap made by `git archive` plus the
#                                          files under test) whose tests/data may be missing (the root's is used)
# stages: test (ctest -L cuda), ab (kiln bench tg128/pp512 with KILN_CUDA_PDL=0/1 and KILN_CUDA_MATMUL=$AB_MATMUL
#         (default: the selector's own pick), 2 rounds),
#         bench (3 rounds kiln vs llama.cpp from .carry/peer-bin, copy ceiling), extra checks in $EXTRA (a script
#         run with the build dir as $1). Build in /tmp/kb (kept while the machine is warm). Logs to $OUT.
set -uo pipefail
SRC=$(cd "$1" && pwd); STAGES=${2:-"test ab"}
ROOT=$PWD; OUT=${OUT:-/tmp/kiln-out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
# Build dependencies: .carry/deps.tar.xz (the debs' files without docs and unused libraries, 1.1 MB) or .carry/debs.
DEPS=/tmp/kiln-deps; mkdir -p $DEPS
if [ -f .carry/deps.tar.xz ]; then tar -xJf .carry/deps.tar.xz -C $DEPS; else for f in .carry/debs/*.deb; do dpkg -x "$f" $DEPS; done; fi
export LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu" LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu"
[ -e "$SRC/tests/data" ] || ln -s "$ROOT/tests/data" "$SRC/tests/data"
[ -e "$SRC/models/kiln-demo.gguf" ] || { mkdir -p "$SRC/models"; ln -s "$ROOT/models/kiln-demo.gguf" "$SRC/models/"; }
FX=${FX:-$ROOT/.carry/fixtures-small}; [ -d "$FX" ] || FX=/nonexistent
B=/tmp/kb
cmake -S "$SRC" -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DKILN_FIXTURES_DIR="$FX" -DCMAKE_PREFIX_PATH="$DEPS/usr" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
TARGETS=${TARGETS:-"all"}
cmake --build $B -j"$(nproc)" --target $TARGETS >"$OUT/build.log" 2>&1 \
  || { grep -A12 -E "error|FAILED" "$OUT/build.log" | head -60; exit 1; }
echo "== build $(el) s"
K=$B/bin/kiln M=/tmp/m8b.gguf
[ -f $M ] || $K synth --shape llama3-8b --type q4_k_m -o $M >/dev/null || exit 1
if [[ " $STAGES " == *" test "* ]]; then  # ctest -L cuda: the CUDA op tests, test_backend_ops(_next), parity, comm
  (cd $B && timeout 200 ctest -L cuda -j16 --output-on-failure --timeout 190 > "$OUT/ctest.log" 2>&1); echo "== ctest -L cuda rc=$? $(el) s"
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" "$OUT/ctest.log" | head -20
fi
if [ -n "${EXTRA:-}" ]; then bash "$SRC/$EXTRA" $B 2>&1 | tee "$OUT/extra.log" | tail -40; echo "== extra $(el) s"; fi
if [[ " $STAGES " == *" ab "* ]]; then
  for r in ${AB_ROUNDS:-1 2}; do for pdl in ${AB_PDL:-0 1}; do
    echo "pdl=$pdl matmul=${AB_MATMUL:-rule} round $r: $(KILN_CUDA_MATMUL=${AB_MATMUL:-} KILN_CUDA_PDL=$pdl KILN_CUDA_GRAPH_STATS=1 $K bench -m $M -p 512 -n 128 -r 3 2>&1 | grep -E 'pp512|tg128|graph' | tr -s ' ' | tr '\n' ' ')"
  done; done | tee "$OUT/ab.txt"
  echo "== ab $(el) s"
fi
if [[ " $STAGES " == *" bench "* ]]; then
  nvcc -O2 -o /tmp/copy_bw "$SRC/bench/cuda_copy_bw.cu" && /tmp/copy_bw | tee "$OUT/copy.txt"
  L=/tmp/llama-bench  # llama.cpp built elsewhere for sm_90 (same source, de3ff81), carried xz-compressed
  [ -x $L ] || { [ -f $ROOT/.carry/peer-bin/llama-bench.xz ] && xz -dc $ROOT/.carry/peer-bin/llama-bench.xz > $L && chmod +x $L; }
  [ -x $L ] && { ldd $L | grep -E "not found" ; $L --help >/dev/null 2>&1 || echo "llama-bench does not start"; }
  for r in 1 2 3; do
    echo "kiln round $r: $($K bench -m $M -p 512 -n 128 -r 3 2>&1 | grep -E 'pp512|tg128' | tr -s ' ' | tr '\n' ' ')"
    [ -x $L ] && echo "llama.cpp round $r: $($L -m $M -p 512 -n 128 -r 3 -ngl 99 2>&1 | grep -E 'pp512|tg128' | tr -s ' ' | tr '\n' ' ')"
  done | tee "$OUT/bench.txt"
  for d in ${DEPTHS:-8192 32768}; do
    echo "kiln d$d: $($K bench -m $M -p 0 -n 128 -d $d -r 2 2>&1 | grep -E 'tg128' | tr -s ' ')"
    [ -x $L ] && echo "llama.cpp d$d: $($L -m $M -p 0 -n 128 -d $d -r 2 -ngl 99 2>&1 | grep -E 'tg128' | tr -s ' ')"
  done | tee -a "$OUT/bench.txt"
  echo "== bench $(el) s"
fi
