#!/bin/bash
# Remakes tests/data/models-gptoss (the gpt-oss parity fixtures) from a llama.cpp build, as
# ../shared/fixtures/tools/gen.sh makes the shared fixtures: F16 source with gguf-py, llama-quantize MXFP4_MOE,
# reference logits and greedy ids from libllama (fixture_ref), statistics with fixture_stats.py, then the manifest.
# usage: tools/gptoss_fixture/gen.sh LLAMA_CPP_SRC LLAMA_CPP_BUILD_BIN FIXTURE_REF_BIN [OUT_DIR [MAKE_GPTOSS_ARGS...]]
#   OUT_DIR defaults to tests/data/models-gptoss; MAKE_GPTOSS_ARGS (e.g. --seed 3 --window 8) change the model.
#   Uses fixture_stats.py from ../shared/fixtures/tools ($KILN_FIXTURES_DIR/tools); Python 3 with numpy.
set -euo pipefail
SRC=$1 BIN=$2 REF=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
OUT=${4:-$repo/tests/data/models-gptoss}
shift $(( $# < 4 ? $# : 4 ))
TOOLS=${KILN_FIXTURES_DIR:-$repo/../shared/fixtures}/tools
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ub1" "$OUT"

# F16 source with the fixtures' vocabulary (read from the committed llama fixture); the shared 32-id prompt
/usr/bin/python3 "$here/make_gptoss.py" model "$SRC/gguf-py" "$repo/tests/data/models/fixture-llama-f16.gguf" "$work" "$@"
cp "$repo/tests/data/models/prompt.txt" "$work/prompt.txt"
ids=$(cat "$work/prompt.txt")

# MXFP4_MOE: the expert stacks MXFP4 (as gpt-oss ships them), every other matrix Q8_0; norms, sinks, biases and
# the router stay F32.
"$BIN/llama-quantize" "$work/fixture-gptoss-f16.gguf" "$work/fixture-gptoss-mxfp4.gguf" MXFP4_MOE 2 >/dev/null 2>&1
names=()
for t in f16 mxfp4; do
  m="$work/fixture-gptoss-$t.gguf"
  "$REF" "$m" "$work/fixture-gptoss-$t" "$ids" 32 512 2>/dev/null
  # the same sequence (prompt + these greedy ids) one token at a time: llama.cpp's own batch-vs-single spread
  "$REF" "$m" "$work/ub1/fixture-gptoss-$t" "$ids,$(cat "$work/fixture-gptoss-$t.greedy.txt")" 0 1 2>/dev/null
  names+=("fixture-gptoss-$t")
done
/usr/bin/python3 "$TOOLS/fixture_stats.py" "$work" "$work/ub1" "${names[@]}"
/usr/bin/python3 "$here/make_gptoss.py" manifest "$SRC/gguf-py" "$work" "${names[@]}"

for n in "${names[@]}"; do cp "$work/$n".{gguf,logits.bin,greedy.txt} "$OUT/"; done
cp "$work/prompt.txt" "$work/manifest.json" "$OUT/"
ls -l "$OUT"
