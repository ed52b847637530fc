#!/usr/bin/env bash
# Device calls of the many-token GEMM work (run from the repo root on the GPU machine; carry .carry with debs/,
# fx/ (fixtures subset), peer-src.tar.xz (../shared/peer/get-llamacpp.sh --subset, tarred)):
#   dev/cuda/gemm_call.sh "stages"
# stages (in this order):
#   build   kiln for sm_90 into build/device (kept while the machine is warm); llama.cpp's CUDA tools from the
#           carried subset in the background (setsid: it outlives the call, later calls on the warm machine use them)
#   ops     the matmul op tests (CudaMmq, CudaBlas, CudaOps.Matmul*)
#   splitt  the split-K tests alone (CudaMmq.SplitK*, StridedDstGapsUntouched)
#   select  dev/cuda/matmul_select_bench: mmq vs dequantize + cuBLAS per type and token count ($SELECT_TYPES)
#   ctest   ctest -L cuda (op tests, backend-parametric ops, parity on the carried fixtures)
#   san     compute-sanitizer memcheck / racecheck on the blas op test
#   e2e     kiln vs llama.cpp on the llama3-8b q4_k_m synth file: pp512 / pp2048 / tg128 (3 interleaved rounds),
#           P sequences decoding (kiln bench -np, llama-batched-bench S_TG); the A/B rows with KILN_CUDA_MATMUL=mmq:
#           the decode rows at $AB_NPL sequences (default 8,16,32), pp512 / pp2048 when AB_PP is set
#   big     pp2048 in 2048-token steps on both sides (kiln -b 2048, llama.cpp -ub 2048)
#   chunk   matmul_select_bench on Q4_K with 16..128 MiB of dequantized-weight scratch (rows per cuBLAS call)
#   e2e_next  qwen3.5-9b and gemma3-12b pp512, kiln and llama.cpp
#   ekiln   kiln alone (no llama.cpp build needed): pp512 / tg128 and P sequences decoding, 2 rounds
#   fattn   the flash-attention prefill tests (both kernels on 9.0 devices) and dev/cuda/fattn_bench --quick
#   depth   kiln vs llama.cpp at depth $DEPTHS (default 32768): pp512 and tg32 after filling the cache, 2 rounds
#   prof    where a P-sequence decode step goes (P in $PROF_NP, default 64): GPU time against the host interval
#           (KILN_CUDA_GRAPH_STATS), then per kernel (nsys with graph nodes traced, else ncu's duration of each
#           launch, graphs off), summed by kernel name over the profiled steps
# Logs go to $OUT; the last lines printed are the tables.
set -uo pipefail
STAGES=" ${1:-build ops} "
OUT=${OUT:-/tmp/kiln-out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
has() { [[ "$STAGES" == *" $1 "* ]]; }
DEPS=/tmp/kiln-deps
if [ ! -d $DEPS/usr ]; then mkdir -p $DEPS && for f in .carry/debs/*.deb; do dpkg -x "$f" $DEPS; done; fi
export LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu" LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu"
B=build/device K=build/device/bin/kiln L=/tmp/peer-build/bin M=/tmp/m8b.gguf
FX=$PWD/.carry/fx; [ -d "$FX" ] || FX=/nonexistent
if has build; then
  if [ ! -x $L/llama-bench ] && [ ! -d /tmp/peer-src ] && [ -f .carry/peer-src.tar.xz ]; then
    # setsid: it outlives this call (the machine stays warm for the next one)
    mkdir -p /tmp/peer-src && tar -xJf .carry/peer-src.tar.xz -C /tmp/peer-src && cp .carry/llamacpp-cuda.sh /tmp/
    setsid nohup bash -c 'nice -n 5 bash /tmp/llamacpp-cuda.sh /tmp/peer-src 90 > /tmp/peer-build.log 2>&1; touch /tmp/peer-build.done' >/dev/null 2>&1 < /dev/null &
  fi
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; git log -1 --format=%h; } | tee "$OUT/env.log"
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DKILN_FIXTURES_DIR="$FX" -DCMAKE_PREFIX_PATH="$DEPS/usr" >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  # -k 0: a target that fails (another compiler's stricter overloads in a test) does not stop the others
  cmake --build $B -j"$(nproc)" -- -k 0 >"$OUT/build.log" 2>&1 || { grep -E "FAILED:|required from here|error:" "$OUT/build.log" | head -20; echo "== build had failures"; }
  echo "== build $(el) s"
fi
rc=0
kb() { $K bench -m $M "$@" 2>&1 | grep -E '^\|.*(pp|tg)[0-9]' | awk -F'|' '{print $(NF-2), $(NF-1)}' | tr -s ' ' | tr '\n' ';'; }
if has ops; then
  timeout 300 $B/tests/test_backend_cuda_mmq > "$OUT/ops_mmq.log" 2>&1; echo "== CudaMmq/CudaBlas rc=$? $(el) s"
  timeout 200 $B/tests/test_backend_cuda_ops --gtest_filter='CudaOps.Matmul*' > "$OUT/ops_matmul.log" 2>&1; echo "== CudaOps.Matmul* rc=$?"
  grep -hE "^\[  (FAILED|PASSED) |Failure|Which is|nmse|vs the" "$OUT"/ops_*.log | head -30
fi
if has splitt; then
  timeout 120 $B/tests/test_backend_cuda_mmq --gtest_filter='CudaMmq.SplitK*:CudaMmq.StridedDst*' > "$OUT/ops_split.log" 2>&1
  echo "== split-K tests rc=$? $(el) s"; grep -hE "^\[  (FAILED|PASSED) |Failure|Which is|nmse" "$OUT/ops_split.log" | head -12
fi
if has opsb; then
  timeout 200 $B/tests/test_backend_ops --gtest_filter='*Matmul*cuda*' > "$OUT/ops_backend.log" 2>&1; echo "== BackendOps Matmul cuda rc=$?"
  grep -hE "^\[  (FAILED|PASSED) |Failure|actual" "$OUT/ops_backend.log" | head -12
fi
if has select; then
  timeout 400 $B/dev/cuda/matmul_select_bench ${SELECT_TYPES:-} ${SELECT_TOKS:-} > "$OUT/select.log" 2>&1; echo "== select rc=$? $(el) s"
  sed -n '/one llama3-8b/,$p' "$OUT/select.log"
fi
if has chunk; then  # the weight scratch's size: rows per cuBLAS call (L2-resident chunks vs one call)
  for c in 16 32 64 128; do
    echo "chunk $c MiB: $(CHUNK_MIB=$c timeout 120 $B/dev/cuda/matmul_select_bench Q4_K 64,512,2048 2>&1 | grep -E '^\| q4_K' | awk -F'|' '{print "n"$3+0, $5+0}' | tr '\n' ';')"
  done | tee "$OUT/chunk.txt"
fi
if has ctest; then
  (cd $B && timeout ${CTEST_TIMEOUT:-400} ctest -L cuda -j8 ${CTEST_EXCLUDE:+-E "$CTEST_EXCLUDE"} --output-on-failure --timeout 380 > "$OUT/ctest.log" 2>&1); rc=$?
  echo "== ctest -L cuda rc=$rc $(el) s"
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)" "$OUT/ctest.log" | head -20
  grep -h "\[parity\]" "$OUT/ctest.log" | grep -i cuda | sort | head -60 > "$OUT/parity_cuda.txt"
fi
if has san; then
  # racecheck skips cuBLAS's own kernels (nvjet_*: their mbarrier/TMA pipelines show as hazards to it); ours
  # (dequant_f16_kernel, act_f16_kernel) use no shared memory
  for tool in memcheck racecheck; do
    ex=; [ $tool = racecheck ] && ex="--kernel-name-exclude kns=nvjet"
    timeout 240 compute-sanitizer --tool $tool $ex --error-exitcode 3 $B/tests/test_backend_cuda_mmq \
      --gtest_filter='CudaBlas.*:CudaMmq.StridedDstGapsUntouched' > "$OUT/san_$tool.log" 2>&1
    echo "== compute-sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/san_$tool.log" | tail -1)"
  done
fi
if has fattn; then
  timeout 300 $B/tests/test_backend_cuda_fattn > "$OUT/fattn_test.log" 2>&1; echo "== fattn tests rc=$? $(el) s"
  grep -hE "^\[  (FAILED|PASSED) |Failure|Which is|NMSE|worst" "$OUT/fattn_test.log" | head -30
  timeout 300 $B/dev/cuda/fattn_bench --quick 2>&1 | tee "$OUT/fattn_bench.txt"; echo "== fattn_bench $(el) s"
fi
if has ekiln; then
  [ -f $M ] || $K synth --shape llama3-8b --type q4_k_m -o $M >/dev/null || exit 1
  for r in 1 2; do
    echo "kiln round $r: $(kb -p 512 -n 128 -r 3)"
    echo "kiln np round $r: $(kb -p 0 -n 128 -d 128 -np ${NPL:-1,8,16,32,64} -r 2)"
  done | tee "$OUT/ekiln.txt"
  echo "== ekiln $(el) s"
fi
if has prof; then
  [ -f $M ] || $K synth --shape llama3-8b --type q4_k_m -o $M >/dev/null || exit 1
  for np in ${PROF_NP:-64}; do
    echo "np$np graph stats: $(KILN_CUDA_GRAPH_STATS=1 $K bench -m $M -p 0 -n 64 -d 128 -np $np -r 1 2>&1 | grep -iE 'graph|tg64' | tr -s ' ' | tr '\n' ';')"
    if command -v nsys >/dev/null; then
      nsys profile -o /tmp/np$np --force-overwrite true --cuda-graph-trace=node -t cuda $K bench -m $M -p 0 -n 16 -d 0 -np $np -r 1 >/dev/null 2>&1
      nsys stats --report cuda_gpu_kern_sum --format csv /tmp/np$np.nsys-rep > "$OUT/prof_np$np.csv" 2>/dev/null
      echo "nsys np$np:"; head -28 "$OUT/prof_np$np.csv" | cut -c1-220
    else
      KILN_CUDA_GRAPHS=0 timeout 300 ncu --metrics gpu__time_duration.sum --csv --launch-skip 400 --launch-count 1500 \
        $K bench -m $M -p 0 -n 8 -d 0 -np $np -r 1 > "$OUT/prof_np$np.csv" 2>/dev/null
      echo "ncu np$np (ns total, count, name):"
      grep gpu__time_duration "$OUT/prof_np$np.csv" | awk -F'","' '{n=$5; sub(/\(.*/,"",n); t[n]+=$NF; c[n]++} END {for (k in t) printf "%12.0f %5d %s\n", t[k], c[k], substr(k,1,90)}' | sort -rn | head -25
    fi
  done | tee "$OUT/prof.txt"
  echo "== prof $(el) s"
fi
if has e2e || has e2e_next || has big || has depth; then
  for i in $(seq 1 60); do [ -f /tmp/peer-build.done ] || [ ! -d /tmp/peer-src ] && break; sleep 5; done
  echo "== peer build $(el) s"; cp /tmp/peer-build.log "$OUT/" 2>/dev/null
  [ -x $L/llama-bench ] || { tail -5 /tmp/peer-build.log 2>/dev/null; echo "no llama.cpp"; }
fi
if has e2e; then
  [ -f $M ] || $K synth --shape llama3-8b --type q4_k_m -o $M >/dev/null || exit 1
  for r in 1 2 3; do
    echo "kiln round $r: $(kb -p 512,2048 -n 128 -r 3)"
    [ -n "${AB_PP:-}" ] && echo "kiln mmq round $r: $(KILN_CUDA_MATMUL=mmq kb -p 512,2048 -n 0 -r 3)"
    [ -x $L/llama-bench ] && echo "llama.cpp round $r: $($L/llama-bench -m $M -p 512,2048 -n 128 -r 3 -ngl 99 -fa 1 2>&1 | grep -E '(pp|tg)[0-9]' | awk -F'|' '{print $(NF-2), $(NF-1)}' | tr -s ' ' | tr '\n' ';')"
  done | tee "$OUT/e2e.txt"
  echo "== e2e pp/tg $(el) s"
  NPL=${NPL:-1,8,16,32,64}
  for r in 1 2; do
    echo "kiln np round $r: $(kb -p 0 -n 128 -d 128 -np $NPL -r 2)"
    [ $r = 1 ] && echo "kiln mmq np round $r: $(KILN_CUDA_MATMUL=mmq kb -p 0 -n 128 -d 128 -np ${AB_NPL:-8,16,32} -r 2)"
    [ -x $L/llama-batched-bench ] && { $L/llama-batched-bench -m $M -c 16640 -b 2048 -ub 512 -npp 128 -ntg 128 -npl $NPL -ngl 99 -fa on > "$OUT/batched_$r.txt" 2>&1;
      echo "llama.cpp np round $r: $(grep -E '^\|' "$OUT/batched_$r.txt" | tail -n +3 | awk -F'|' '{print "np"$4+0, $9+0}' | tr '\n' ';')"; }
  done | tee -a "$OUT/e2e.txt"
  echo "== e2e np $(el) s"
fi
if has depth; then  # pp512 / tg32 at depth, kiln and llama.cpp in turn
  [ -f $M ] || $K synth --shape llama3-8b --type q4_k_m -o $M >/dev/null || exit 1
  for d in ${DEPTHS:-32768}; do
    for r in 1 2; do
      echo "kiln d$d round $r: $(kb -p 512 -n 32 -d $d -r 2)"
      [ -x $L/llama-bench ] && echo "llama.cpp d$d round $r: $($L/llama-bench -m $M -p 512 -n 32 -d $d -r 2 -ngl 99 -fa 1 2>&1 | grep -E '(pp|tg)[0-9]' | awk -F'|' '{print $(NF-2), $(NF-1)}' | tr -s ' ' | tr '\n' ';')"
    done
  done | tee "$OUT/depth.txt"
  echo "== depth $(el) s"
fi
if has big; then  # 2048-token steps on both sides (kiln -b 2048, llama.cpp -ub 2048), 2 rounds
  [ -f $M ] || $K synth --shape llama3-8b --type q4_k_m -o $M >/dev/null || exit 1
  for r in 1 2; do
    echo "kiln b2048 round $r: $(kb -p 2048 -n 0 -b 2048 -r 3)"
    [ -x $L/llama-bench ] && echo "llama.cpp ub2048 round $r: $($L/llama-bench -m $M -p 2048 -n 0 -b 2048 -ub 2048 -r 3 -ngl 99 -fa 1 2>&1 | grep -E 'pp[0-9]' | awk -F'|' '{print $(NF-2), $(NF-1)}' | tr -s ' ' | tr '\n' ';')"
  done | tee "$OUT/big.txt"
fi
if has e2e_next; then
  for sh in qwen3.5-9b gemma3-12b; do
    F=/tmp/$sh.gguf
    [ -f $F ] || $K synth --shape $sh --type q4_k_m -o $F >/dev/null || { echo "synth $sh failed"; continue; }
    for r in 1 2; do
      echo "kiln $sh round $r: $($K bench -m $F -p 512 -n 0 -r 3 2>&1 | grep -E 'pp512' | tr -s ' ')"
      [ -x $L/llama-bench ] && echo "llama.cpp $sh round $r: $($L/llama-bench -m $F -p 512 -n 0 -r 3 -ngl 99 -fa 1 2>&1 | grep -E 'pp512' | tr -s ' ')"
    done
  done | tee "$OUT/e2e_next.txt"
  echo "== e2e_next $(el) s"
fi
exit $rc
