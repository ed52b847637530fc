#!/usr/bin/env bash
# Side-by-side CPU benchmark, kiln vs llama.cpp, on the same synthetic GGUF file and the same machine, in one run.
#   bench/cpu_vs_llamacpp.sh [SHAPE=llama3-1b] [TYPE=q4_k_m] [THREADS=2] [REPS=5] [PROMPT=128] [GEN=32]
# Needs: build/release/bin/kiln (scripts/build.sh) and llama.cpp's tools (../shared/peer/get-llamacpp.sh builds
# them into /tmp/llama.cpp, override with LLAMA_BIN=dir). Prints both tables and the kiln/llama.cpp ratios; the
# raw JSON goes to $OUT_DIR (default /tmp/kiln-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPE=${1:-llama3-1b} TYPE=${2:-q4_k_m} T=${3:-2} R=${4:-5} P=${5:-128} N=${6:-32}
LLAMA_BIN=${LLAMA_BIN:-/tmp/llama.cpp/build/bin}
OUT_DIR=${OUT_DIR:-/tmp/kiln-bench}
mkdir -p "$OUT_DIR"
KILN=build/release/bin/kiln
MODEL="$OUT_DIR/$SHAPE-$TYPE.gguf"
[ -f "$MODEL" ] || $KILN synth --shape "$SHAPE" --type "$TYPE" -o "$MODEL"
# Same page-cache state for every run: decode speed here depends on whether the file sits in the cache as it was
# written (small pages) or re-read (large pages), by 10-15% for both engines. Evict it, then read it back once.
sync
python3 -c 'import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$MODEL"
cat "$MODEL" >/dev/null
echo "machine: $(lscpu | sed -n 's/^Model name: *//p') x$(nproc), $(date -u +%F), kiln $(git rev-parse --short HEAD)"
# Interleave the two engines so drift in machine load hits both alike.
for i in 1 2 3; do
  $KILN bench -m "$MODEL" -p "$P" -n "$N" -t "$T" -r "$R" -o json > "$OUT_DIR/kiln.$i.json"
  "$LLAMA_BIN/llama-bench" -m "$MODEL" -p "$P" -n "$N" -t "$T" -r "$R" -o json > "$OUT_DIR/llama.$i.json" 2>/dev/null
done
python3 - "$OUT_DIR" <<'PY'
import json, sys, statistics, glob
d = sys.argv[1]
def load(prefix):
    rows = {}
    for f in sorted(glob.glob(f"{d}/{prefix}.*.json")):
        for r in json.load(open(f)):
            key = f"pp{r['n_prompt']}" if r['n_prompt'] else f"tg{r['n_gen']}"
            rows.setdefault(key, []).append(r['avg_ts'])
    return {k: statistics.median(v) for k, v in rows.items()}
k, l = load("kiln"), load("llama")
print(f"{'test':8} {'kiln t/s':>10} {'llama.cpp t/s':>14} {'ratio':>7}   (median of 3 runs, each the mean of -r reps)")
for t in k:
    print(f"{t:8} {k[t]:10.2f} {l.get(t, float('nan')):14.2f} {k[t] / l.get(t, float('nan')):7.2f}")
PY
