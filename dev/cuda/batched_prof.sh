#!/usr/bin/env bash
# Several sequences decoding together (EXTRA for snap_run.sh; build dir $1): graph replay GPU time per step at
# -np 1/8/16/32 and an ncu per-kernel profile of one step at each NPROF (duration, DRAM bytes) into
# $OUT/ncu_np<P>.csv.
set -u
B=$1; K=$B/bin/kiln; M=/tmp/m8b.gguf; OUT=${OUT:-/tmp}
for np in ${NPL:-1 8 16 32}; do
  echo "np$np: $(KILN_CUDA_GRAPH_STATS=1 $K bench -m $M -p 0 -n 64 -np $np -r 2 2>&1 | grep -E 'tg64|graph' | tr -s ' ' | tr '\n' ' ')"
done
for np in ${NPROF:-8 32}; do
  timeout ${NCU_S:-100} ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --print-units base $K bench -m $M -p 0 -n 2 -np $np -r 1 > "$OUT/ncu_np$np.csv" 2> "$OUT/ncu_np$np.err"
  echo "== ncu np$np rc=$? $(wc -l < "$OUT/ncu_np$np.csv") lines"
done
