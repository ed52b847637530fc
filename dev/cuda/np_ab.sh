#!/usr/bin/env bash
# EXTRA for snap_run.sh (build dir $1): P sequences decoding together, each with 128 tokens in its cache
# (`kiln bench -d 128 -n 128 -np P`), with the tensor-core GEMV (default) and without (KILN_CUDA_MMVQ_MMA=0: the
# dp4a GEMV in passes of 16), and the graph replay GPU time at one and 16 sequences.
set -u
B=$1; K=$B/bin/kiln; M=/tmp/m8b.gguf; NPL=${NPL:-1,8,16,32,64}
kb() { $K bench -m $M -p 0 -n 128 -d 128 -np $NPL -r 2 2>&1 | grep -E 'tg128' | sed -E 's/.*\| +(tg128[^|]*)\| +([0-9.]+) .*/\1 \2/' | tr '\n' ';'; }
echo "kiln mma: $(kb)"
echo "kiln dp4a: $(KILN_CUDA_MMVQ_MMA=0 kb)"
for np in 1 16; do
  echo "np$np graph: $(KILN_CUDA_GRAPH_STATS=1 $K bench -m $M -p 0 -n 64 -np $np -r 1 2>&1 | grep -E 'graph replay' | tr -s ' ')"
done
