#!/usr/bin/env bash
# Regenerates tests/data/demo from a training run and a kiln binary built with the committed model:
#   tools/train_demo/make_test_data.sh RUN_DIR KILN_BINARY [DATA_DIR]
# RUN_DIR: train.py's --out (reference.json, reference_logits.f32); DATA_DIR: bpe.py's vocabulary and val.txt
# (default <repo>/.carry/demo).
#   heldout.txt/.ids       ~3.6 KB of held-out chapters + a paragraph of text the corpus never has, and bpe.py's ids
#   reference_ids.txt      BOS + "And God said" + PyTorch's greedy continuation (32 ids)
#   reference_logits.f32   PyTorch's f32 logits for them, [32][4096]
#   kiln_logits.f32        kiln's logits for them (regression reference)
#   greedy.txt             kiln's greedy continuation of "And God said" (48 ids, `kiln run --ids` format)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
run=$1 kiln=$2 data=${3:-$repo/.carry/demo}
out=$repo/tests/data/demo
mkdir -p "$out"
python3 - "$data/val.txt" "$out/heldout.txt" <<'PY'
import sys
docs = [d for d in open(sys.argv[1], encoding='utf-8', newline='').read().split('<|endoftext|>') if d]
text = ''
for d in docs:  # whole held-out chapters until ~4 KB
    if len(text) > 3500:
        break
    text += d
extra = ("\nIt's 1611 -- they'd say \"Selah!\"\t\tand   spaces  ;\n\n"
         "Caf\u00e9 na\u00efve \u00c6sir \u2014 \u65e5\u672c\u8a9e \U0001F525 123456 x=3.14 I've we'll you're\r\n"
         "  leading spaces and a trailing one \n")
open(sys.argv[2], 'w', encoding='utf-8', newline='').write(text + extra)
PY
python3 "$repo/tools/train_demo/bpe.py" encode --dir "$data" --text "$out/heldout.txt" "$out/heldout.ids"
python3 -c "import json, sys; print(' '.join(map(str, json.load(open(sys.argv[1]))['ids'])))" \
  "$run/reference.json" > "$out/reference_ids.txt"
cp "$run/reference_logits.f32" "$out/reference_logits.f32"
chmod 644 "$out"/*
ids=$(tr ' ' ',' < "$out/reference_ids.txt" | tr -d '\n')
"$kiln" logits -m "$repo/models/kiln-demo.gguf" --tokens "$ids" --all -t 1 -o "$out/kiln_logits.f32"
"$kiln" run -p "And God said" -n 48 --temp 0 --ids -t 1 2>/dev/null > "$out/greedy.txt"
