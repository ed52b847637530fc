#!/bin/bash
# Remakes tests/data/models-quant (the parity fixture of the codebook, ternary and i-quant weight types) from a
# llama.cpp build, as ../shared/fixtures/tools/gen.sh makes the shared fixtures: the shared llama F16 source
# quantized by llama-quantize into one file with a type per matrix (below), reference logits and greedy ids from
# libllama (fixture_ref), statistics with fixture_stats.py, then the manifest.
# usage: tools/quant_fixture/gen.sh LLAMA_CPP_SRC LLAMA_CPP_BUILD_BIN FIXTURE_REF_BIN [OUT_DIR]
#   OUT_DIR defaults to tests/data/models-quant. Reads fixture-llama-f16.gguf and fixture_stats.py from
#   ../shared/fixtures ($KILN_FIXTURES_DIR); Python 3 with numpy.
set -euo pipefail
SRC=$1 BIN=$2 REF=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
OUT=${4:-$repo/tests/data/models-quant}
FX=${KILN_FIXTURES_DIR:-$repo/../shared/fixtures}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ub1" "$OUT"

cp "$FX/models/fixture-llama-f16.gguf" "$FX/models/prompt.txt" "$work/"
chmod 644 "$work"/*
ids=$(cat "$work/prompt.txt")

# One file holds every type: layer 0 the codebook, ternary and reference-rounded types, layer 1 the seven i-quant
# grid types, one per matrix role; token_embd IQ3_XXS (get_rows of a grid type), output IQ4_XS. llama-quantize
# refuses IQ2_XXS/IQ2_XS/IQ2_S/IQ1_S/IQ1_M without an importance matrix: an all-ones one (make_imatrix.py) for the
# layer-1 matrices only, so that layer 0 gets each type's reference rounding (what kiln's MXFP4, TQ1_0, TQ2_0, Q4_0
# and Q8_0 quantizers reproduce byte for byte, and what the IQ4 error-level check compares against).
q() { "$BIN/llama-quantize" "$@" 2 >/dev/null 2>&1; }
/usr/bin/python3 "$here/make_imatrix.py" "$SRC/gguf-py" "$work/fixture-llama-f16.gguf" "$work/ones.imatrix.gguf" \
  '^blk\.1\.'
mix=(--imatrix "$work/ones.imatrix.gguf" --token-embedding-type iq3_xxs --output-tensor-type iq4_xs)
for tt in attn_q=iq4_nl attn_k=iq4_xs attn_v=q8_0 attn_output=mxfp4 ffn_gate=tq1_0 ffn_up=tq2_0 ffn_down=q4_0; do
  mix+=(--tensor-type "blk\.0\.$tt")
done
for tt in attn_q=iq2_xxs attn_k=iq2_xs attn_v=iq3_xxs attn_output=iq3_s ffn_gate=iq2_s ffn_up=iq1_s ffn_down=iq1_m; do
  mix+=(--tensor-type "blk\.1\.$tt")
done
q "${mix[@]}" "$work/fixture-llama-f16.gguf" "$work/fixture-llama-mix.gguf" Q8_0

names=()
for t in f16 mix; do
  m="$work/fixture-llama-$t.gguf"
  "$REF" "$m" "$work/fixture-llama-$t" "$ids" 32 512 2>/dev/null
  # the same sequence (prompt + these greedy ids) one token at a time: llama.cpp's own batch-vs-single spread
  "$REF" "$m" "$work/ub1/fixture-llama-$t" "$ids,$(cat "$work/fixture-llama-$t.greedy.txt")" 0 1 2>/dev/null
  names+=("fixture-llama-$t")
done
/usr/bin/python3 "$FX/tools/fixture_stats.py" "$work" "$work/ub1" "${names[@]}"
/usr/bin/python3 "$here/make_manifest.py" "$SRC/gguf-py" "$work" "${names[@]:1}"

# committed: the quantized files and their references (the F16 source is the shared fixture's)
for n in "${names[@]:1}"; do cp "$work/$n".{gguf,logits.bin,greedy.txt} "$OUT/"; done
cp "$work/prompt.txt" "$work/manifest.json" "$OUT/"
ls -l "$OUT"
