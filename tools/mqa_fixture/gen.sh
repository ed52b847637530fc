#!/bin/bash
# Remakes tests/data/models-mqa (the MQA parity fixture) from a llama.cpp build, as ../shared/fixtures/tools/gen.sh
# makes the shared fixtures: F16 source with gguf-py, llama-quantize Q4_K_M, reference logits and greedy ids from
# libllama (fixture_ref), statistics with fixture_stats.py, then the manifest.
# usage: tools/mqa_fixture/gen.sh LLAMA_CPP_SRC LLAMA_CPP_BUILD_BIN FIXTURE_REF_BIN [OUT_DIR [MAKE_MQA_ARGS...]]
#   OUT_DIR defaults to tests/data/models-mqa; MAKE_MQA_ARGS (e.g. --n-embd 512 --n-ff 512) change the shape.
#   Uses fixture_stats.py from ../shared/fixtures/tools ($KILN_FIXTURES_DIR/tools).
set -euo pipefail
SRC=$1 BIN=$2 REF=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
OUT=${4:-$repo/tests/data/models-mqa}
shift $(( $# < 4 ? $# : 4 ))
TOOLS=${KILN_FIXTURES_DIR:-$repo/../shared/fixtures}/tools
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ub1" "$OUT"

# F16 source with the fixtures' vocabulary (read from the committed llama fixture)
/usr/bin/python3 "$here/make_mqa.py" model "$SRC/gguf-py" "$repo/tests/data/models/fixture-llama-f16.gguf" "$work" "$@"

# prompt: BOS then 149 seeded ids from the normal-token range (0..996); its first 32 are the shared fixtures' prompt
ids=$(/usr/bin/python3 -c "import random; r=random.Random(7); print(','.join(['997']+[str(r.randrange(997)) for _ in range(149)]))")
echo "$ids" > "$work/prompt.txt"

"$BIN/llama-quantize" "$work/fixture-mqa-f16.gguf" "$work/fixture-mqa-q4_k_m.gguf" Q4_K_M 2 >/dev/null 2>&1
for t in f16 q4_k_m; do
  m="$work/fixture-mqa-$t.gguf"
  "$REF" "$m" "$work/fixture-mqa-$t" "$ids" 16 512 2>/dev/null
  # the same sequence (prompt + these greedy ids) one token at a time: llama.cpp's own batch-vs-single spread
  "$REF" "$m" "$work/ub1/fixture-mqa-$t" "$ids,$(cat "$work/fixture-mqa-$t.greedy.txt")" 0 1 2>/dev/null
done
/usr/bin/python3 "$TOOLS/fixture_stats.py" "$work" "$work/ub1" fixture-mqa-f16 fixture-mqa-q4_k_m
/usr/bin/python3 "$here/make_mqa.py" manifest "$SRC/gguf-py" "$work" fixture-mqa-q4_k_m

# committed: the Q4_K_M file and its references (the F16 source is only the quantizer's input)
cp "$work/prompt.txt" "$work/manifest.json" "$work"/fixture-mqa-q4_k_m.{gguf,logits.bin,greedy.txt} "$OUT/"
ls -l "$OUT"
