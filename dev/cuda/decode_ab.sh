#!/usr/bin/env bash
# Decode A/B extras for snap_run.sh (EXTRA=dev/cuda/decode_ab.sh; build dir $1): weight prefetch before pdl_wait
# on/off (KILN_CUDA_PREFETCH, 2 rounds, with the graph replay GPU time), the split cap at depth 8192/32768
# (KILN_CUDA_ATTN_SPLITS), several sequences decoding together (kiln bench -np), and an ncu per-kernel profile of
# a few decode steps (duration, DRAM bytes) into $OUT/ncu.csv.
set -u
B=$1; K=$B/bin/kiln; M=/tmp/m8b.gguf; OUT=${OUT:-/tmp}
for r in 1 2; do for pf in 0 1; do
  echo "prefetch=$pf round $r: $(KILN_CUDA_PREFETCH=$pf KILN_CUDA_GRAPH_STATS=1 $K bench -m $M -p 0 -n 128 -r 3 2>&1 | grep -E 'tg128|graph' | tr -s ' ' | tr '\n' ' ')"
done; done
for sp in ${SPLITS:-32 64 128}; do
  echo "splits<=$sp: $(KILN_CUDA_ATTN_SPLITS=$sp $K bench -m $M -p 0 -n 128 -d ${DEPTHS:-8192,32768} -r 2 2>&1 | grep -E 'tg128' | tr -s ' ' | tr '\n' ' ')"
done
echo "parallel: $($K bench -m $M -p 0 -n 128 -np ${NPL:-1,8,16,32,64} -r 2 2>&1 | grep -E 'tg128' | tr -s ' ' | tr '\n' ' ')"
timeout ${NCU_S:-120} ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  --csv --print-units base $K bench -m $M -p 0 -n 2 -r 1 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"; echo "== ncu rc=$?"
tail -2 "$OUT/ncu.err"; wc -l < "$OUT/ncu.csv"
