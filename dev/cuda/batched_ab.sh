#!/usr/bin/env bash
# Several sequences decoding together (EXTRA for snap_run.sh; build dir $1), kiln vs llama.cpp in one call:
# tg128 at 1/8/16/32/64 sequences, each with 128 prompt tokens in its cache (`kiln bench -d 128 -n 128 -np P`,
# llama.cpp: `llama-batched-bench -npp 128 -ntg 128 -npl P`, S_TG t/s), the A/B of the 4-row GEMV
# (KILN_CUDA_MMVQ_RRB=1: 1 row) and of the GEMV/GEMM threshold (KILN_CUDA_GEMV_TOK=16: the GEMM above 16 tokens).
set -u
B=$1; K=$B/bin/kiln; M=/tmp/m8b.gguf; OUT=${OUT:-/tmp}; NPL=${NPL:-1,8,16,32,64}
L=/tmp/llama-batched-bench
[ -x $L ] || { [ -f .carry/peer-bin/llama-batched-bench.xz ] && xz -dc .carry/peer-bin/llama-batched-bench.xz > $L && chmod +x $L; }
kb() { $K bench -m $M -p 0 -n 128 -d 128 -np $NPL -r 2 2>&1 | grep -E 'tg128' | sed -E 's/.*\| +(tg128[^|]*)\| +([0-9.]+) .*/\1 \2/' | tr '\n' ';'; }
for r in 1 2; do
  echo "kiln round $r: $(kb)"
  [ $r = 1 ] && echo "kiln RRB=1 round $r: $(KILN_CUDA_MMVQ_RRB=1 kb)"
  [ $r = 1 ] && echo "kiln GEMV_TOK=16 round $r: $(KILN_CUDA_GEMV_TOK=16 kb)"
  [ -x $L ] && { $L -m $M -c 16640 -b 2048 -ub 512 -npp 128 -ntg 128 -npl $NPL -ngl 99 -fa on > $OUT/batched_bench_$r.txt 2>&1 \
    || $L -m $M -c 16640 -b 2048 -ub 512 -npp 128 -ntg 128 -npl $NPL -ngl 99 -fa > $OUT/batched_bench_$r.txt 2>&1;
    echo "llama.cpp round $r: $(grep -E '^\|' $OUT/batched_bench_$r.txt | tail -n +3 | awk -F'|' '{print "np"$4+0, $9+0}' | tr '\n' ';')"; }
done
