#!/usr/bin/env bash
# Runs on the GPU machine (repository root, $OUT set): trains each configuration given as an argument string,
# keeps the one with the lowest final validation loss and copies its exports to $OUT (<= 8 files):
# model-*.safetensors, config.json, reference.json, reference_logits.f32, samples.txt, train.log (all runs).
#   tools/train_demo/device_train.sh "NAME:--n-embd 384 --n-layer 4 ..." ...
set -euo pipefail
export PYTHONUNBUFFERED=1
data=${DEMO_DATA:-.carry/demo}
log=$OUT/train.log
nvidia-smi -L | tee -a "$log"
python3 -c 'import torch, safetensors, regex; print("torch", torch.__version__)' | tee -a "$log"
best= best_loss=
for spec in "$@"; do
  name=${spec%%:*} flags=${spec#*:}
  echo "=== run $name: $flags" | tee -a "$log"
  # shellcheck disable=SC2086
  python3 tools/train_demo/train.py --data "$data" --out "/tmp/demo-$name" --ckpt-dir "/tmp/demo-ckpt-$name" \
    $flags 2>&1 | tee -a "$log"
  loss=$(python3 -c "import json; print(json.load(open('/tmp/demo-$name/config.json'))['metrics']['val_loss'])")
  echo "=== run $name: val_loss $loss" | tee -a "$log"
  if [ -z "$best" ] || python3 -c "import sys; sys.exit(0 if $loss < $best_loss else 1)"; then
    best=$name best_loss=$loss
  fi
done
echo "=== best: $best (val_loss $best_loss)" | tee -a "$log"
cp /tmp/demo-"$best"/{model-*.safetensors,config.json,reference.json,reference_logits.f32,samples.txt} "$OUT/"
