#!/usr/bin/env bash
# On the GPU machine: kiln (CUDA) vs llama.cpp (CUDA, flash attention on, all layers on the GPU) on the same
# `kiln synth` file written there, interleaved, median of 3 runs (each the mean of -r reps), plus the
# device-to-device copy ceiling measured in the same call.
#   bench/cuda_vs_llamacpp.sh [SHAPE=llama3-8b] [TYPE=q4_k_m] [REPS=3] [TESTS="-p 512 -n 128"]
# Needs build/device/bin/kiln (bench/device_check.sh builds it) and llama.cpp's CUDA tools (LLAMA_BIN, default
# /tmp/peer-build/bin: ../shared/peer/llamacpp-cuda.sh builds them from the carried subset). LLAMA_BIN=none skips
# the peer. Prints one table: test, kiln t/s, llama.cpp t/s, ratio, kiln GB/s (weight bytes read per token x t/s,
# tg only), % of the copy bandwidth.
set -uo pipefail
cd "$(dirname "$0")/.."
SHAPE=${1:-llama3-8b} TYPE=${2:-q4_k_m} R=${3:-3} TESTS=${4:-"-p 512 -n 128"}
KILN=${KILN:-build/device/bin/kiln}
LLAMA_BIN=${LLAMA_BIN:-/tmp/peer-build/bin}
D=${BENCH_DIR:-/tmp/kiln-cuda-bench}
mkdir -p "$D"
MODEL="$D/$SHAPE-$TYPE.gguf"
[ -f "$MODEL" ] || $KILN synth --shape "$SHAPE" --type "$TYPE" -o "$MODEL" || exit 1
$KILN info "$MODEL" --json > "$D/info.json"
nvcc -O2 -o "$D/copy_bw" bench/cuda_copy_bw.cu && "$D/copy_bw" | tee "$D/copy.txt"
echo "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), $(date -u +%F), kiln $(git rev-parse --short HEAD 2>/dev/null)"
for i in 1 2 3; do
  $KILN bench -m "$MODEL" $TESTS -r "$R" -o json > "$D/kiln.$i.json" 2> "$D/kiln.$i.err" || tail -5 "$D/kiln.$i.err"
  if [ "$LLAMA_BIN" != none ]; then
    "$LLAMA_BIN/llama-bench" -m "$MODEL" $TESTS -r "$R" -fa 1 -ngl 99 -o json > "$D/llama.$i.json" 2> "$D/llama.$i.err" || tail -5 "$D/llama.$i.err"
  fi
done
python3 - "$D" <<'PY'
import json, sys, statistics, glob, os
d = sys.argv[1]
def load(prefix):
    rows = {}
    for f in sorted(glob.glob(f"{d}/{prefix}.*.json")):
        try:
            data = json.load(open(f))
        except Exception:
            continue
        for r in data:
            key = f"pp{r['n_prompt']}" if r['n_prompt'] else f"tg{r['n_gen']}"
            rows.setdefault(key, []).append(r['avg_ts'])
    return {k: statistics.median(v) for k, v in rows.items()}
k, l = load("kiln"), load("llama")
info = json.load(open(f"{d}/info.json"))
wbytes = sum(t["bytes"] for t in info["tensors"] if not t["name"].startswith("token_embd"))
copy = float(open(f"{d}/copy.txt").read().split()[1])
print(f"weights read per token: {wbytes/1e9:.3f} GB; copy bandwidth {copy:.0f} GB/s")
print(f"| test | kiln t/s | llama.cpp t/s | ratio | kiln GB/s | % of copy |")
print(f"|---|---:|---:|---:|---:|---:|")
for t in k:
    lv = l.get(t, float('nan'))
    gbs = k[t] * wbytes / 1e9 if t.startswith("tg") else float('nan')
    print(f"| {t} | {k[t]:.1f} | {lv:.1f} | {k[t]/lv:.2f} | {gbs:.0f} | {100*gbs/copy:.0f}% |")
PY
