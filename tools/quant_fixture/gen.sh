#!/bin/bash
# Remakes tests/data/models-quant (parity fixtures of the codebook weight types) from a llama.cpp build, as
# ../shared/fixtures/tools/gen.sh makes the shared fixtures: the shared llama F16 source quantized by llama-quantize
# (no imatrix) to IQ4_NL, IQ4_XS, a dense MXFP4 file, TQ1_0 and TQ2_0, one file of the seven i-quant grid types
# (with an all-ones importance matrix from make_imatrix.py, which they require), reference logits and greedy ids from libllama
# (fixture_ref), statistics with fixture_stats.py, then the manifest.
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

# MXFP4: llama-quantize's MXFP4_MOE file type quantizes only expert tensors (a dense model comes out Q8_0), so
# the dense fixture names its matrices: every attention and FFN matrix MXFP4, token_embd and output Q8_0 (what
# MXFP4_MOE writes for the non-expert tensors).
mx=()
for t in attn_q attn_k attn_v attn_output ffn_gate ffn_up ffn_down; do mx+=(--tensor-type "$t=mxfp4"); done
q() { "$BIN/llama-quantize" "$@" 2 >/dev/null 2>&1; }
q "$work/fixture-llama-f16.gguf" "$work/fixture-llama-iq4_nl.gguf" IQ4_NL
q "$work/fixture-llama-f16.gguf" "$work/fixture-llama-iq4_xs.gguf" IQ4_XS
q "${mx[@]}" "$work/fixture-llama-f16.gguf" "$work/fixture-llama-mxfp4.gguf" Q8_0
q "$work/fixture-llama-f16.gguf" "$work/fixture-llama-tq1_0.gguf" TQ1_0
q "$work/fixture-llama-f16.gguf" "$work/fixture-llama-tq2_0.gguf" TQ2_0
# The i-quant grid types, one per matrix role so that one file holds all seven (token_embd IQ3_XXS: get_rows of a
# grid type; output Q6_K, the Q4_K_S file type's). llama-quantize refuses IQ2_XXS/IQ2_XS/IQ2_S/IQ1_S/IQ1_M without
# an importance matrix: an all-ones one (make_imatrix.py) weighs every column alike.
/usr/bin/python3 "$here/make_imatrix.py" "$SRC/gguf-py" "$work/fixture-llama-f16.gguf" "$work/ones.imatrix.gguf"
iq=(--imatrix "$work/ones.imatrix.gguf" --token-embedding-type iq3_xxs)
for tt in attn_q=iq2_xxs attn_k=iq2_xs attn_v=iq3_xxs attn_output=iq3_s ffn_gate=iq2_s ffn_up=iq1_s ffn_down=iq1_m; do
  iq+=(--tensor-type "$tt")
done
q "${iq[@]}" "$work/fixture-llama-f16.gguf" "$work/fixture-llama-iq_grid.gguf" Q4_K_S

names=()
for t in f16 iq4_nl iq4_xs mxfp4 tq1_0 tq2_0 iq_grid; do
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
