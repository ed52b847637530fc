#!/usr/bin/env bash
# The peer's own spread on the parity fixtures, per row: llama.cpp's logits through its one-token path on the CPU
# and on the GPU, and its batched GPU path, against the reference it wrote (the fixture's logits.bin, batched on
# the CPU). Rows where llama.cpp itself lands above the parity limit are routing near-ties of the MoE fixtures;
# tests/data/parity_peer_spread.json records them (by hand, from this script's output) and test_model_parity
# applies the fixtures README's rule (limit = 4 x the peer's spread) to those rows with the spread measured here.
#   dev/peer/parity_spread.sh LLAMA_SRC LLAMA_BUILD FIXTURES_DIR   (LLAMA_BUILD: a GGML_CUDA=ON build with libllama)
set -euo pipefail
S=$1 BUILD=$2 FX=$3
here=$(cd "$(dirname "$0")" && pwd)
g++ -O2 -std=c++17 "$here/llamacpp_logits.cpp" -I"$S/include" -I"$S/ggml/include" -L"$BUILD/bin" -lllama -lggml \
  -lggml-base -Wl,-rpath,"$BUILD/bin" -o /tmp/llamacpp_logits
for stem in fixture-qwen3moe-q8_0 fixture-qwen3moe-q4_k_m; do
  ids="$(cat "$FX/models-moe/prompt.txt"),$(cat "$FX/models-moe/$stem.greedy.txt")"
  for cfg in "1 99" "512 99" "1 0"; do
    set -- $cfg
    /tmp/llamacpp_logits "$FX/models-moe/$stem.gguf" "$ids" "$1" "$2" /tmp/llamacpp_logits.bin >/dev/null 2>&1
    python3 - "$FX/models-moe/$stem.logits.bin" /tmp/llamacpp_logits.bin "$stem ubatch $1 ngl $2" <<'PY'
import array, sys
def load(p):
    a = array.array('f'); a.frombytes(open(p, 'rb').read()); return a
ref, got = load(sys.argv[1]), load(sys.argv[2])
n = len(ref) // 64
e = [sum((g - x) ** 2 for g, x in zip(got[r*n:(r+1)*n], ref[r*n:(r+1)*n])) / sum(x * x for x in ref[r*n:(r+1)*n])
     for r in range(64)]
top = sorted(range(64), key=lambda r: -e[r])[:4]
print(f"{sys.argv[3]:42s} max {max(e):.2e} mean {sum(e)/64:.2e} " + " ".join(f"row {r} {e[r]:.1e}" for r in top))
PY
  done
done
